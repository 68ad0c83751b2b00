"""The paper's training recipe on Trainer: arguments (one parser), `PaperTrainer` and the Noam schedule (§5.3),
the run's stages, checkpoints (resume, §6.1 averaging) and metrics (sacreBLEU, the paper's tokenized BLEU)."""

from .arguments import (
    DataArguments,
    ModelArguments,
    RecipeArguments,
    TranslationTrainingArguments,
    parse_training_args,
)
from .checkpoints import average_checkpoints, last_checkpoints
from .run import check_run_can_start, evaluate_bleu, load_raw_splits, run
from .schedule import PAPER_ADAM, NoamLambda, noam_peak_rate, noam_schedule, paper_adam
from .trainer import PaperTrainer

__all__ = ["ModelArguments", "DataArguments", "RecipeArguments", "TranslationTrainingArguments",
           "parse_training_args", "run", "check_run_can_start", "load_raw_splits", "evaluate_bleu", "PaperTrainer",
           "NoamLambda", "noam_peak_rate", "noam_schedule", "paper_adam", "PAPER_ADAM", "average_checkpoints", "last_checkpoints"]
