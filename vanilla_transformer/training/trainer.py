"""`Seq2SeqTrainer` with the paper's schedule (§5.3) and token-based batches (§5.1)."""

import copy
import logging
import time

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import EarlyStoppingCallback, Seq2SeqTrainer, TrainerCallback
from transformers.trainer_pt_utils import BatchRebalanceSampler

from ..data.batching import TokenBucketBatchSampler, example_lengths
from .arguments import NOAM
from .schedule import NoamLambda, noam_peak_rate

logger = logging.getLogger(__name__)


class TokenBatches(TokenBucketBatchSampler, BatchRebalanceSampler):
    """`TokenBucketBatchSampler` as Trainer takes a rank-aware batch sampler: Trainer's `_get_dataloader` passes a
    `BatchRebalanceSampler` to the DataLoader as its `batch_sampler` and makes accelerate's shard wrapper a
    pass-through (an `isinstance` test, the same in transformers 5.23 and 5.25). Only the type is borrowed: the
    constructor, `__iter__`, `__len__` and `set_epoch` are TokenBucketBatchSampler's, and BatchRebalanceSampler's
    constructor never runs, so none of its attributes exist."""


class PaperTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer that runs the paper's schedule (§5.3) for `lr_scheduler_type="noam"`, and §5.1's token batches
    for `max_tokens_per_batch`.

    The Noam run's arguments say what runs: `learning_rate` is equation (3)'s peak (filled in from the model's
    d_model when not given) and `warmup_steps` its warmup. Overriding `create_scheduler` rather than passing
    `optimizers=(...)` lets Trainer build the optimizer itself after wrapping the model, which FSDP and DeepSpeed
    require.
    """

    def __init__(self, model=None, args=None, *more, max_tokens_per_batch: int | None = None,
                 token_dropout: float = 0.0, **kwargs):
        tokenizer = kwargs.get("processing_class")
        if token_dropout and getattr(tokenizer, "unk_token_id", None) is None:  # before Trainer creates output_dir
            raise ValueError(f"--token_dropout {token_dropout} replaces tokens by the tokenizer's unknown token, but "
                             f"this tokenizer ({type(tokenizer).__name__}) has none.")
        if args is not None and args.lr_scheduler_type == NOAM and args.learning_rate is None:
            args.learning_rate = noam_peak_rate(model.config.d_model, args.warmup_steps)
        super().__init__(model, args, *more, **kwargs)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.token_dropout = token_dropout
        self.noam_scheduler = None

    def get_train_dataloader(self) -> DataLoader:
        """Trainer's own training DataLoader (collator, unused columns removed, workers and their seeds, accelerate),
        on §5.1's token batches when `max_tokens_per_batch` is given (see `_get_train_sampler`)."""
        streaming = (torch.utils.data.IterableDataset, datasets.IterableDataset)
        if self.max_tokens_per_batch is not None and isinstance(self.train_dataset, streaming):
            raise ValueError(f"The training set is a {type(self.train_dataset).__name__} (streaming): token-based "
                             "batching (--max_tokens_per_batch, --tokens_per_step) needs every example's length up "
                             "front, so it needs a map-style datasets.Dataset.")
        loader = super().get_train_dataloader()
        shard = getattr(loader, "batch_sampler", None)
        if isinstance(getattr(shard, "batch_sampler", None), TokenBatches):
            # accelerate's BatchSamplerShard, which Trainer made a pass-through, has no set_epoch of its own; a resumed
            # run's loader (accelerate's skip_first_batches) reaches the sampler only through it, so it passes the
            # epoch on, or the resumed epoch would replay epoch 0's order.
            shard.set_epoch = shard.batch_sampler.set_epoch
        return loader

    def _get_train_sampler(self, train_dataset=None):
        # Trainer's private hook for the training sampler (`_get_train_sampler`, the same in transformers 5.23 and
        # 5.25): Trainer's `_get_dataloader` calls it on the split with unused columns removed.
        if self.max_tokens_per_batch is None:
            return super()._get_train_sampler(train_dataset)
        dataset, args = self.train_dataset if train_dataset is None else train_dataset, self.args
        if getattr(args, "train_sampling_strategy", "random") not in ("random", None):
            logger.warning("--train_sampling_strategy %s is ignored: --max_tokens_per_batch sets the batches.",
                           args.train_sampling_strategy)
        return TokenBatches(
            *example_lengths(dataset), self.max_tokens_per_batch,
            seed=args.data_seed if args.data_seed is not None else args.seed, num_replicas=max(1, args.world_size),
            rank=args.process_index if args.world_size > 1 else 0,
            # The budget counts the padding the collator adds, so it must know the collator's multiple.
            pad_to_multiple_of=getattr(self.data_collator, "pad_to_multiple_of", None) or 1,
        )

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.token_dropout:
            inputs = self.drop_tokens(inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def drop_tokens(self, inputs: dict) -> dict:
        """Word dropout on subwords (Sennrich & Zhang, 2019): each source token and each target token the decoder
        reads is replaced by the unknown token with probability `token_dropout`; the labels it predicts stay, and
        so do special tokens and padding. Training only: evaluation's batches never pass through here."""
        tokenizer = self.processing_class
        dropped = dict(inputs)
        if "decoder_input_ids" not in inputs and "labels" in inputs:
            # The model would shift the labels into the decoder's input itself, past this point: shift them here.
            model = self.accelerator.unwrap_model(self.model)
            dropped["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=inputs["labels"])
        for name in ("input_ids", "decoder_input_ids"):
            ids = dropped.get(name)
            if ids is None:
                continue
            special = torch.tensor(tokenizer.all_special_ids, device=ids.device)
            drop = (torch.rand(ids.shape, device=ids.device) < self.token_dropout) & ~torch.isin(ids, special)
            dropped[name] = ids.masked_fill(drop, tokenizer.unk_token_id)
        return dropped

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # Seq2SeqTrainer fills the model's generation config with transformers' global defaults (max_length 20,
        # ...) when it generates; every checkpoint saved after an evaluation would then decode with them.
        # Restored on the unwrapped model, the one checkpoints save (an FSDP wrapper would keep the attribute itself).
        unwrapped = self.accelerator.unwrap_model(self.model)
        generation_config = copy.deepcopy(unwrapped.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            unwrapped.generation_config = generation_config

    def create_scheduler(self, num_training_steps, optimizer=None):
        ours = self.lr_scheduler is None or self.lr_scheduler is self.noam_scheduler  # a new train() starts it again
        if self.args.lr_scheduler_type != NOAM or not ours:
            return super().create_scheduler(num_training_steps, optimizer)
        d_model, warmup, peak = self.model.config.d_model, self.args.warmup_steps, self.args.learning_rate
        # The factor that puts equation (3)'s peak at this run's learning rate; the rate is then eq. (3) exactly.
        schedule = NoamLambda(d_model, warmup, peak / noam_peak_rate(d_model, warmup), base_lr=peak)
        self.lr_scheduler = self.noam_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, schedule)
        return self.lr_scheduler


class TrainingTimeBudget(TrainerCallback):
    """Stops training once `minutes` of wall-clock time have passed since it began: the step in progress ends and
    is saved as a checkpoint (where checkpoints are saved by steps), so what follows (averaging, evaluation) finds
    the newest weights. Every process stops at the same step: the slowest clock decides, through one all-reduce
    of the elapsed time a step (the only per-step read-back it adds, and only with several processes).

    With `decay_minutes`, the Noam rate is multiplied by a ramp from 1 down to 0 over the budget's last
    `decay_minutes`, read from the same clock: the run ends annealed at whichever step the machine reaches.
    The scheduler fixes each update's rate one step ahead, so the ramp follows the clock a step late."""

    def __init__(self, minutes: float, decay_minutes: float | None = None):
        self.seconds = 60 * minutes
        self.decay_seconds = None if decay_minutes is None else 60 * decay_minutes
        self.schedules = []
        self.started = None
        self.stopped_at_step = None

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        if self.decay_seconds is not None:
            scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # under accelerate's wrapper, if any
            self.schedules = list(getattr(scheduler, "lr_lambdas", []))
            if not self.schedules or not all(isinstance(f, NoamLambda) for f in self.schedules):
                raise ValueError(f"--lr_decay_minutes anneals the Noam schedule, but this run's scheduler is "
                                 f"{type(scheduler).__name__}: use --lr_scheduler_type noam, or a transformers "
                                 "schedule that decays by steps (linear, cosine) without --lr_decay_minutes.")
            for schedule in self.schedules:
                schedule.decay = 1.0  # a resumed run's budget starts again, as its clock does
        self.started = time.monotonic()
        decaying = "" if self.decay_seconds is None else (
            f", its learning rate falling linearly to zero over the last {self.decay_seconds / 60:.1f} minutes")
        logger.warning("Training stops after %.1f minutes or at step %d, whichever comes first (the progress bar "
                       "counts steps)%s.", self.seconds / 60, state.max_steps, decaying)

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = time.monotonic() - self.started
        if args.world_size > 1 and torch.distributed.is_initialized():
            # Every process must also see the same ramp, or their learning rates (and weights) would drift apart.
            clock = torch.tensor(elapsed, dtype=torch.float64, device=args.device)
            torch.distributed.all_reduce(clock, op=torch.distributed.ReduceOp.MAX)
            elapsed = clock.item()
        if self.decay_seconds is not None:
            for schedule in self.schedules:
                schedule.decay = min(1.0, max(0.0, (self.seconds - elapsed) / self.decay_seconds))
        if elapsed >= self.seconds and not control.should_training_stop:
            logger.warning("Stopping after step %d: the --max_train_minutes budget of %.1f minutes is spent.",
                           state.global_step, self.seconds / 60)
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
            control.should_save = args.save_strategy == "steps"
        return control


class EarlyStopping(EarlyStoppingCallback):
    """transformers' EarlyStoppingCallback (--early_stopping_patience) that also remembers the step of the best
    evaluation, which Trainer records only where it saves checkpoints."""

    best_step: int | None = None

    def check_metric_value(self, args, state, control, metric_value):
        super().check_metric_value(args, state, control, metric_value)
        if self.early_stopping_patience_counter == 0:
            self.best_step = state.global_step

    def report(self, state) -> dict:
        return {"patience": self.early_stopping_patience, "best": state.best_metric, "best_step": self.best_step,
                "stopped": self.early_stopping_patience_counter >= self.early_stopping_patience}


__all__ = ["PaperTrainer", "TokenBatches", "TrainingTimeBudget", "EarlyStopping"]
