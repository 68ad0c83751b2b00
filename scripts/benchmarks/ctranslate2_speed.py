"""CTranslate2 exports of a trained model against the model itself and `MarianMTModel` through `generate()`.

    python scripts/benchmarks/ctranslate2_speed.py --model runs/multi30k     # the README's Multi30k run

Speed: the same 16 validation sentences decoded to exactly 30 tokens (eos held back, so every system does the
same work), greedy and beam 4, at 1 and 2 threads, interleaved: ours and Marian (carrying our weights, so the
same function) through `generate()`, and the float32 and int8 exports. Quality: all of Multi30k validation
with beam 4 and source + 50 tokens: BLEU of ours (GNMT penalty, as saved; and transformers' |Y|^alpha, which
the engine uses), of both exports, the share of sentences where the float32 export gives ours' tokens, and
every sentence where it does not, with both hypotheses' length-normalised scores.
Skips, with the reason, where the model or ../shared/data/multi30k is absent.
"""

import argparse
import os
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from .toolkit import environment, load_multi30k, multi30k_missing, time_interleaved, write_report  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig, MarianMTModel  # noqa: E402

from vanilla_transformer.tools.marian import copy_weights_into_marian, marian_config_like  # noqa: E402
from vanilla_transformer.tools.export import export_ctranslate2, translate_ctranslate2  # noqa: E402
from vanilla_transformer.training.metrics import corpus_scores  # noqa: E402
from vanilla_transformer.tools.translation import translate  # noqa: E402

SENTENCES, NEW_TOKENS, BEAMS = 16, 30, 4


def fixed_length(model, num_beams):
    c = model.config
    return GenerationConfig(num_beams=num_beams, min_new_tokens=NEW_TOKENS, max_new_tokens=NEW_TOKENS,
                            length_penalty=0.6 if num_beams > 1 else 1.0, decoder_start_token_id=c.decoder_start_token_id,
                            bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)


def speed(ours, marian, tokenizer, exports, sources, threads, repeats):
    import ctranslate2

    torch.set_num_threads(threads)
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(sources)["input_ids"]]
    translators = {name: ctranslate2.Translator(str(path), intra_threads=threads) for name, path in exports.items()}
    rows = {}
    for label, beams in (("greedy", 1), ("beam 4", BEAMS)):
        tasks = {name: (lambda m=model: m.generate(**batch, generation_config=fixed_length(m, beams)))
                 for name, model in (("ours", ours), ("marian", marian))}
        for name, translator in translators.items():
            tasks[name] = lambda t=translator: t.translate_batch(
                tokens, beam_size=beams, length_penalty=0.6 if beams > 1 else 1.0,
                min_decoding_length=NEW_TOKENS, max_decoding_length=NEW_TOKENS)
        with torch.inference_mode():
            times = time_interleaved(tasks, repeats, warmup=1)
        median = {name: statistics.median(ts) for name, ts in times.items()}
        rows[label] = {name: {"ms": s * 1e3, "speed_vs_ours": median["ours"] / s,
                              "tokens_per_s": SENTENCES * NEW_TOKENS / s} for name, s in median.items()}
    return rows


def hypothesis_score(translator, tokenizer, source, hypothesis, alpha=0.6):
    """log P(Y | X) / |Y|^alpha of one hypothesis under the float32 export (eos counted, as beam search does)."""
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(source)["input_ids"])
    target = tokenizer.convert_ids_to_tokens(tokenizer(text_target=hypothesis, add_special_tokens=False)["input_ids"])
    log_probs = translator.score_batch([tokens], [target])[0].log_probs
    return sum(log_probs) / len(log_probs) ** alpha


def main(argv=None):
    import ctranslate2

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/multi30k")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--output", default="scripts/benchmarks/results/ctranslate2_multi30k")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    args = parser.parse_args(argv)
    reason = multi30k_missing(args.data_dir) or (None if Path(args.model, "config.json").is_file()
                                                 else f"no trained model in {args.model} (train it first: README)")
    if reason:
        print(f"skipped: {reason}")
        return None
    ours = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    marian = MarianMTModel(marian_config_like(ours.config)).eval()
    copy_weights_into_marian(ours, marian)
    raw = load_multi30k(args.data_dir)["validation"]["translation"]
    sources, references = [p["en"] for p in raw], [p["de"] for p in raw]
    work = Path(tempfile.mkdtemp(prefix="vt_ct2_"))
    exports = {"ct2 float32": export_ctranslate2(args.model, work / "fp32"),
               "ct2 int8": export_ctranslate2(args.model, work / "int8", quantization="int8")}
    size = {name: (path / "model.bin").stat().st_size for name, path in exports.items()}
    size["ours (safetensors)"] = Path(args.model, "model.safetensors").stat().st_size
    results = {"environment": environment(), "model": args.model, "file_bytes": size,
               "speed": {threads: speed(ours, marian, tokenizer, exports, sources[:SENTENCES], threads, args.repeats)
                         for threads in args.threads}}

    torch.set_num_threads(max(args.threads))
    hypotheses = {"ours, GNMT (as saved)": translate(ours, tokenizer, sources),
                  "ours, |Y|^alpha": translate(ours, tokenizer, sources, length_penalty_type="hf")}
    for name, path in exports.items():
        hypotheses[name] = translate_ctranslate2(path, sources, threads=max(args.threads))
    results["bleu"] = {name: corpus_scores(h, references) for name, h in hypotheses.items()}
    same = [a == b for a, b in zip(hypotheses["ours, |Y|^alpha"], hypotheses["ct2 float32"])]
    translator = ctranslate2.Translator(str(exports["ct2 float32"]))
    results["float32_same_tokens"] = sum(same) / len(same)
    results["float32_differences"] = [
        {"source": sources[i], "ours": hypotheses["ours, |Y|^alpha"][i], "export": hypotheses["ct2 float32"][i],
         "score_ours": hypothesis_score(translator, tokenizer, sources[i], hypotheses["ours, |Y|^alpha"][i]),
         "score_export": hypothesis_score(translator, tokenizer, sources[i], hypotheses["ct2 float32"][i])}
        for i, ok in enumerate(same) if not ok]
    command = shlex.join(["python", "scripts/benchmarks/ctranslate2_speed.py", *(sys.argv[1:] if argv is None else argv)])
    paths = write_report(args.output, {"command": command, **results}, render(results, command))
    print(paths["md"].read_text())
    return results


def render(results, command):
    lines = [f"# CTranslate2 exports of `{results['model']}` on Multi30k en→de", "", f"`{command}`", "",
             f"{results['environment']['cpu']}, torch {results['environment']['torch']}. Speed: {SENTENCES} validation "
             f"sentences, exactly {NEW_TOKENS} tokens each, interleaved medians; Marian carries our weights.", ""]
    for threads, rows in results["speed"].items():
        lines += [f"## {threads} thread(s)", "", "| decoding | system | ms | tokens/s | speed vs ours |", "|---|---|---|---|---|"]
        for label, systems in rows.items():
            lines += [f"| {label} | {name} | {r['ms']:.0f} | {r['tokens_per_s']:,.0f} | {r['speed_vs_ours']:.2f}x |"
                      for name, r in systems.items()]
        lines.append("")
    size = results["file_bytes"]
    lines += ["## Size", "", "| file | MB | vs safetensors |", "|---|---|---|"]
    lines += [f"| {name} | {b / 1e6:.1f} | {b / size['ours (safetensors)']:.2f}x |" for name, b in size.items()]
    lines += ["", "## Quality (all of validation, beam 4, source + 50 tokens)", "", "| system | BLEU | chrF |", "|---|---|---|"]
    lines += [f"| {name} | {s['bleu']:.2f} | {s['chrf']:.2f} |" for name, s in results["bleu"].items()]
    lines += ["", f"The float32 export gives ours' tokens (|Y|^alpha) on **{results['float32_same_tokens']:.1%}** of the "
              f"sentences. Where not (score: log P / |Y|^0.6 under the export):", ""]
    lines += ["| source | ours | export | score ours | score export |", "|---|---|---|---|---|"]
    lines += [f"| {d['source']} | {d['ours']} | {d['export']} | {d['score_ours']:.4f} | {d['score_export']:.4f} |"
              for d in results["float32_differences"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
