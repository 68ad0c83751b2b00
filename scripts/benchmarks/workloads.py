"""The workloads the benchmarks time, and the systems that run them: `BenchmarkSpec` (what to measure), our model and
`MarianMTModel` built to the same shape (the closest in-tree peer), synthetic right-padded batches, the training step
and its model FLOPs, and fixed-length decoding through `generate()`, also without its cache on our weights
(`use_cache=False`: the decoder re-run over the whole prefix at every step)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from functools import partial

import torch
from transformers import GenerationConfig, MarianMTModel

from vanilla_transformer.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from vanilla_transformer.data.corpora import available_cores
from vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.support_vanilla_transformer import check_int
from vanilla_transformer.tools.marian import marian_config_like

# A vocabulary per preset: a small BPE for the CPU presets, the paper's shared 37k BPE (§5.1) for Table 3's.
DEFAULT_VOCAB = {"tiny": 1000, "small": 8000, "base": 37000, "big": 37000}
SYSTEMS = ("ours", "marian", "uncached")  # uncached: generate(use_cache=False) on ours


@dataclasses.dataclass
class BenchmarkSpec:
    """What to measure, and where. `quick()` is a seconds-long run that checks the plumbing, not the speed."""

    preset: str = "small"
    device: str = "cpu"  # e.g. "cuda:0": models and batches live there, and each timed call is waited for
    vocab_size: int | None = None  # None: DEFAULT_VOCAB[preset]
    batch_size: int = 32  # training batch
    source_length: int = 32  # longest source; lengths are drawn from [source_length // 2, source_length]
    target_length: int = 32  # longest training target, drawn the same way
    generation_batch_size: int = 16
    new_tokens: int = 30  # decoded tokens per sentence, exactly (eos suppressed)
    num_beams: int = 4
    repeats: int = 5
    warmup: int = 1
    threads: int | None = None  # None: every core this process may run on
    matmul_size: int = 2048
    memory: bool = True  # peak resident memory of CPU subprocesses: on the CPU only
    bf16: bool = False  # the training steps under bf16 autocast over float32 weights, as Trainer --bf16 runs them
    # The training step under torch.compile too (Trainer --torch_compile); quick mode uses aot_eager, since
    # inductor's C++ code generation takes a minute per model on a small CPU.
    compile_backend: str | None = "inductor"
    isolate_memory: bool = True  # one fresh subprocess per system; quick mode shares one to save start-up time
    seed: int = 0
    config_overrides: dict = dataclasses.field(default_factory=dict)  # e.g. a recipe's dropouts, for both models

    @property
    def autocast(self) -> torch.dtype | None:
        return torch.bfloat16 if self.bf16 else None

    @classmethod
    def quick(cls, **overrides) -> "BenchmarkSpec":
        values = dict(preset="tiny", batch_size=4, source_length=8, target_length=8, generation_batch_size=2,
                      new_tokens=4, repeats=1, warmup=0, matmul_size=128, threads=1, isolate_memory=False,
                      compile_backend="aot_eager")
        return cls(**{**values, **overrides})

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"Unknown preset {self.preset!r}; choose one of {sorted(PRESETS)}.")
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"`device` {self.device!r} is not a torch device: {error}") from None
        if self.memory and device.type != "cpu":
            raise ValueError(f"`memory` measures the resident memory of CPU processes; with device {self.device!r} "
                             "pass memory=False.")
        if self.vocab_size is None:
            self.vocab_size = DEFAULT_VOCAB[self.preset]
        if self.threads is None:
            self.threads = available_cores()
        for name in ("vocab_size", "batch_size", "source_length", "target_length", "generation_batch_size",
                     "new_tokens", "num_beams", "repeats", "threads", "matmul_size"):
            check_int(f"`{name}`", getattr(self, name))
        if self.vocab_size < 5:
            raise ValueError("`vocab_size` must leave room for ids past the 4 special tokens.")


def model_config(spec: BenchmarkSpec) -> VanillaTransformerConfig:
    return VanillaTransformerConfig.from_preset(spec.preset, vocab_size=spec.vocab_size, **spec.config_overrides)


def max_positions(spec: BenchmarkSpec) -> int:
    longest = max(spec.source_length, spec.target_length, spec.new_tokens) + 1
    return 1 << (longest - 1).bit_length()  # Marian keeps a table of this many positions


def build_model(spec: BenchmarkSpec, system: str = "ours", attn_implementation: str = "sdpa") -> torch.nn.Module:
    """Ours or Marian ("marian", the same shape) on the spec's device, seeded with the spec's seed."""
    config = model_config(spec)
    torch.manual_seed(spec.seed)
    if system == "ours":
        model = VanillaTransformerForConditionalGeneration._from_config(config, attn_implementation=attn_implementation)
    elif system == "marian":
        model = MarianMTModel._from_config(marian_config_like(config, max_positions(spec)),
                                           attn_implementation=attn_implementation)
    else:
        raise ValueError(f"`system` must be 'ours' or 'marian', got {system!r}.")
    if model.config._attn_implementation != attn_implementation:
        raise RuntimeError(f"{system} runs {model.config._attn_implementation!r} attention, not "
                           f"{attn_implementation!r}.")
    return model.to(spec.device)


def build_models(spec: BenchmarkSpec) -> dict[str, torch.nn.Module]:
    """Ours and Marian, both with SDPA attention; the uncached system decodes with ours."""
    return {system: build_model(spec, system) for system in ("ours", "marian")}


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Trainable parameters (shared embeddings counted once), frozen parameters and buffers (Marian's: its two
    sinusoidal position tables and `final_logits_bias`, never trained)."""
    params = {id(p): p for p in model.parameters()}.values()
    return {"trainable": sum(p.numel() for p in params if p.requires_grad),
            "frozen": sum(p.numel() for p in params if not p.requires_grad),
            "buffers": sum(b.numel() for b in model.buffers())}


def token_counts(batch: dict) -> tuple[int, int]:
    """The source and target tokens of a training batch, not padding: the work model-FLOPs utilisation counts."""
    source = batch.get("attention_mask")
    source_tokens = int(source.sum()) if source is not None else batch["input_ids"].numel()
    return source_tokens, int((batch["labels"] != -100).sum())


def training_flops(config, batch_size: int, source_length: int, target_length: int, attention: bool = True,
                   source_tokens: int | None = None, target_tokens: int | None = None) -> int:
    """Model FLOPs of one training step (forward + backward = 3 x forward), 2 per multiply-add of every matmul:
    projections, feed-forward and output layer on `source_tokens` and `target_tokens` positions (default: the
    padded batch), and with `attention` the scores and their weighted sums over the padded squares."""
    d = config.d_model
    source_tokens = batch_size * source_length if source_tokens is None else source_tokens
    target_tokens = batch_size * target_length if target_tokens is None else target_tokens
    encoder_per_token = config.encoder_layers * (2 * 4 * d * d + 2 * 2 * d * config.encoder_ffn_dim)
    cross_kv_per_source_token = config.decoder_layers * 2 * 2 * d * d
    decoder_per_token = config.decoder_layers * (2 * 6 * d * d + 2 * 2 * d * config.decoder_ffn_dim)
    decoder_per_token += 2 * d * config.vocab_size
    scores = int(attention) * batch_size * 2 * 2 * d * (
        config.encoder_layers * source_length * source_length
        + config.decoder_layers * (target_length * target_length + target_length * source_length))
    forward = (source_tokens * (encoder_per_token + cross_kv_per_source_token) + target_tokens * decoder_per_token
               + scores)
    return 3 * forward


def padded_ids(batch: int, longest: int, vocab_size: int, generator: torch.Generator, pad_id: int = 0):
    """(ids, mask): ids above the 4 special tokens, lengths drawn from [longest // 2, longest], right-padded to the
    longest drawn, as a collator pads a real batch."""
    lengths = torch.randint(max(1, longest // 2), longest + 1, (batch,), generator=generator)
    width = int(lengths.max())
    ids = torch.randint(4, vocab_size, (batch, width), generator=generator)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return ids.masked_fill(~mask, pad_id), mask.long()


def training_batch(spec: BenchmarkSpec, config: VanillaTransformerConfig, seed: int | None = None) -> dict:
    generator = torch.Generator().manual_seed(spec.seed + 1 if seed is None else seed)
    input_ids, attention_mask = padded_ids(spec.batch_size, spec.source_length, config.vocab_size, generator,
                                           config.pad_token_id)
    labels, label_mask = padded_ids(spec.batch_size, spec.target_length, config.vocab_size, generator)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask,
             "labels": labels.masked_fill(label_mask == 0, -100)}
    return {name: tensor.to(spec.device) for name, tensor in batch.items()}


def source_batch(spec: BenchmarkSpec, config: VanillaTransformerConfig, batch: int) -> dict:
    generator = torch.Generator().manual_seed(spec.seed + 2)
    input_ids, attention_mask = padded_ids(batch, spec.source_length, config.vocab_size, generator,
                                           config.pad_token_id)
    return {"input_ids": input_ids.to(spec.device), "attention_mask": attention_mask.to(spec.device)}


def make_train_step(model: torch.nn.Module, batch: dict, autocast: torch.dtype | None = None,
                    optimizer: torch.optim.Optimizer | None = None) -> Callable[[], float]:
    """One optimizer step as a training loop runs it, dropout on, each model with its own loss (ours label-smoothed,
    Marian's plain cross-entropy), the forward under `autocast` as Trainer --bf16 runs it; it returns the loss."""
    optimizer = optimizer or torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    device_type = next(iter(batch.values())).device.type

    def step() -> float:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss.item()

    step.model, step.optimizer = model, optimizer
    return step


def training_steps(models: dict[str, torch.nn.Module], batch: dict, compile_backend: str | None = None,
                   optimizer: Callable | None = None, **options) -> dict[str, Callable[[], float]]:
    """Each model's `make_train_step(**options)` by its name; with `compile_backend`, as `<name>_eager` beside
    `<name>_compiled`: a copy under torch.compile (as Trainer --torch_compile runs it) training its own weights."""
    steps = {}
    for name, model in models.items():
        variants = {name: model} if compile_backend is None else {
            f"{name}_eager": model, f"{name}_compiled": torch.compile(copy.deepcopy(model), backend=compile_backend)}
        for label, variant in variants.items():
            params = [p for p in variant.parameters() if p.requires_grad]
            steps[label] = make_train_step(variant, batch, optimizer=optimizer and optimizer(params), **options)
    return steps


def generate_fixed_length(model, input_ids, attention_mask, new_tokens: int, num_beams: int = 1,
                          **options) -> torch.Tensor:
    """Exactly `new_tokens` tokens (eos suppressed), so all systems do equal work; beam search with the paper's length
    penalty 0.6 (§6.1), which cannot change the ranking at a fixed length. `options` go to the GenerationConfig."""
    model.eval()
    config = model.config
    # Greedy states the global default so that our model's beam-search length penalty is not merged in.
    extra = dict(length_penalty=0.6, early_stopping=False) if num_beams > 1 else dict(length_penalty=1.0)
    generation_config = GenerationConfig(
        num_beams=num_beams, do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens,
        decoder_start_token_id=config.decoder_start_token_id, bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, **{"use_cache": True, **extra, **options})
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config)


def decoders(models: dict[str, torch.nn.Module], source: dict, num_beams: int) -> dict[str, Callable]:
    """Each system's fixed-length decoding of `source` by its name (`SYSTEMS`), called with `new_tokens=`."""
    runs = {name: partial(generate_fixed_length, model, **source, num_beams=num_beams)
            for name, model in models.items()}
    return {**runs, "uncached": partial(runs["ours"], use_cache=False)}
