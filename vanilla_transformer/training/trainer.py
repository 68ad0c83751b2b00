"""`Seq2SeqTrainer` with the paper's schedule (§5.3) and token-based batches (§5.1)."""

import copy

import torch
from transformers import Seq2SeqTrainer

from ..data.batching import token_batch_train_dataloader
from .arguments import TranslationTrainingArguments
from .schedule import NoamLambda


class PaperTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer whose scheduler is the paper's (§5.3) when `noam_schedule` is given.

    Overriding `create_scheduler` rather than passing `optimizers=(...)` lets Trainer build the optimizer
    itself after wrapping the model, which FSDP and DeepSpeed require.
    """

    def __init__(self, *args, noam_schedule: NoamLambda | None = None, max_tokens_per_batch: int | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.noam_schedule = noam_schedule
        self.max_tokens_per_batch = max_tokens_per_batch
        chose_another = isinstance(self.args, TranslationTrainingArguments) and not self.args.noam
        if noam_schedule is None and chose_another and self.args.learning_rate == 1.0:
            raise ValueError(f"--lr_scheduler_type {self.args.lr_scheduler_type.value} takes its rate from "
                             "--learning_rate, which is still 1.0, the Noam schedule's placeholder: pass --learning_rate "
                             "(e.g. 5e-4), or use --lr_scheduler_type noam.")
        if noam_schedule is not None and self.args.learning_rate != 1.0:
            raise ValueError(
                f"With the Noam schedule the learning rate comes from the schedule, so --learning_rate must be "
                f"1.0 (got {self.args.learning_rate}); scale the curve with --noam_factor instead."
            )

    def get_train_dataloader(self):
        if self.max_tokens_per_batch is None:
            return super().get_train_dataloader()
        return token_batch_train_dataloader(self, self.max_tokens_per_batch)

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
        if self.noam_schedule is None or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, self.noam_schedule)
        self._created_lr_scheduler = True
        return self.lr_scheduler


__all__ = ["PaperTrainer"]
