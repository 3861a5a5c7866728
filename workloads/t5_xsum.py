"""t5-xsum: T5 fine-tuned for abstractive summarisation on XSum.

Through the DeepSpeed engine and any launcher. The smoke (``dsenv smoke t5-xsum``) needs
nothing from the network: a tiny T5 from a T5Config, a Unigram tokenizer estimated here, and
a synthetic data set in XSum's layout (document, summary, id) saved with save_to_disk and
read back with load_from_disk, as the full run reads the real one. The full run
(``dsenv run t5-xsum``) fine-tunes t5-small on XSum from the offline cache (`dsenv fetch
t5-xsum`), documents cut to 128 tokens and summaries to 64, AdamW at 5e-5; ``--preset
zero3-offload`` is ZeRO-3 with the optimizer offloaded to the CPU, which fits t5-3b on one
32 GB GPU (https://www.deepspeed.ai/tutorials/zero-offload/). Evaluation: greedy summaries
of the validation documents, ROUGE-1/2/L F1 (the rouge-score package, stemmed, as the XSum
papers report it), a few printed beside their references. The model's parameter count is
reported and checked against the sizes of the T5 variants (t5_variants.toml).

Reads top to bottom: settings, assets, data, evaluation, the model's training, the run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.data import load_table
from dsenv.workloads import registry, runner, synthetic, tiny
from dsenv.workloads.training import engine

NAME = "t5-xsum"
COLUMNS = ("document", "summary", "id")
SPLITS = ("train", "validation")
PREFIX = "summarize: "  # T5's task prefix for summaries (the T5 paper, arXiv:1910.10683)
VARIANTS: dict = load_table("dsenv.workloads", "t5_variants.toml")
THRESHOLDS = ("min_loss_drop", "min_rouge1", "min_rouge2", "min_rougeL")  # Settings fields
PACKAGES = {"rouge_score": "rouge-score"}  # module -> distribution, beyond torch/transformers
OPTIONS = {"epochs": "epochs", "max_length": "max_source_length"}  # full runs: option -> field
ASSETS = "generating synthetic XSum data, tokenizer and tiny T5"


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings(runner.Settings):  # batches and schedule: runner.Settings
    max_source_length: int = 128  # document tokens (1024 in the paper's setting)
    max_target_length: int = 64  # summary tokens
    # sanity thresholds: ROUGE F1 in percent on the validation documents
    min_rouge1: float = 24.0  # floors
    min_rouge2: float = 5.0
    min_rougeL: float = 18.0  # noqa: N815 (ROUGE-L's own spelling, as rouge-score names it)
    # smoke only: the synthetic task and the tiny T5 built from a T5Config
    train_documents: int = 3000
    dev_documents: int = 100  # validation and test each
    vocab_size: int = 800  # Unigram pieces (tiny.train_unigram)
    d_model: int = 64
    d_ff: int = 128
    d_kv: int = 32
    heads: int = 2
    layers: int = 1  # encoder and decoder each; 2 learn no faster per second (measured)
    dropout: float = 0.0


# Full run: t5-small, one epoch of XSum at 32 documents per device (train_batch_size 32 on
# one GPU), AdamW 5e-5. Published t5-small fine-tuned on XSum: ROUGE-1 28-29, ROUGE-2 ~8,
# ROUGE-L ~22; one epoch stays below that, hence the margins (no GPU was lent to measure it).
FULL = Settings(micro_batch=32, epochs=1, warmup_fraction=0.02, lr=5e-5, eval_batch=64,
                min_loss_drop=0.05, perf_key=registry.reference_key(NAME, "full"))

# Smoke thresholds, from measured runs on the 2-core CPU (bench/RESULTS.md): healthy ROUGE
# in the high 90s; lr 0 generates no summary at all (ROUGE 0).
SMOKE = replace(FULL, max_source_length=40, max_target_length=12, micro_batch=16, steps=500,
                warmup_steps=50, lr=3e-3, min_loss_drop=0.5, min_rouge1=70.0,
                min_rouge2=50.0, min_rougeL=70.0, perf_key=registry.reference_key(NAME, "smoke"))


# ----------------------------------------------------------------------------- assets
def write_synthetic(folder: Path, s: Settings, seed: int) -> None:
    """Synthetic XSum: news-like documents in XSum's layout, each with a one-line summary."""
    synthetic.save_task(folder, "xsum", s.train_documents, s.dev_documents, seed)


def train_tokenizer(data_dir: Path, s: Settings):
    """A Unigram tokenizer estimated on the training documents (prefixed) and summaries."""
    train = runner.load_saved(data_dir, COLUMNS, SPLITS)["train"]
    return tiny.train_unigram(
        [PREFIX + d for d in train["document"]] + list(train["summary"]), s.vocab_size)


def tiny_model(s: Settings, tokenizer):
    """The tiny T5, <pad> its decoder's start as in T5."""
    # transformers: only once a run starts
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(T5Config(
        vocab_size=len(tokenizer), d_model=s.d_model, d_ff=s.d_ff, d_kv=s.d_kv,
        num_heads=s.heads, num_layers=s.layers, num_decoder_layers=s.layers,
        dropout_rate=s.dropout, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id))


def parameter_check(model) -> dict:
    """The model's parameter count, and the table's figure when its configuration is one
    of the table's variants (t5-small, t5-large, t5-3b)."""
    count = model.num_parameters()
    for variant, entry in VARIANTS.items():
        if all(getattr(model.config, key, None) == value
               for key, value in entry["config"].items()):
            return {"count": count, "variant": variant, "expected": entry["parameters"],
                    "matches": count == entry["parameters"]}
    return {"count": count, "variant": None}


# ----------------------------------------------------------------------------- data
def samples(data: runner.SavedData, s: Settings) -> tuple[int, str, str]:
    """The documents a full run plans its steps over."""
    return len(data.splits["train"]), "documents", "documents"


def encode(split, tokenizer, s: Settings) -> dict:
    """input_ids and attention_mask of the prefixed documents; labels of the summaries with
    padding as -100 (no loss there)."""
    inputs = tokenizer([PREFIX + d for d in split["document"]], max_length=s.max_source_length,
                       truncation=True, padding="max_length")
    labels = tokenizer(list(split["summary"]), max_length=s.max_target_length, truncation=True,
                       padding="max_length")["input_ids"]
    pad = tokenizer.pad_token_id
    return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"],
            "labels": [[t if t != pad else -100 for t in row] for row in labels]}


# ----------------------------------------------------------------------------- evaluate
def rouge(references: list[str], predictions: list[str]) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F1, in percent (rouge-score, Porter stemmer)."""
    from rouge_score import rouge_scorer  # rouge_score: only once a run evaluates

    kinds = ("rouge1", "rouge2", "rougeL")
    scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
    scores = [scorer.score(ref, pred) for ref, pred in zip(references, predictions, strict=True)]
    return {kind: 100.0 * sum(s[kind].fmeasure for s in scores) / max(len(scores), 1)
            for kind in kinds}


def summary_rows(split, predictions: list[str], count: int) -> list[dict]:
    """``count`` generated summaries spread over the set, beside their references and the
    document (printed, and in the report for its HTML page)."""
    if count <= 0:
        return []
    step = max(1, len(predictions) // count)
    return [{"document": " ".join(split[i]["document"].split()),
             "generated": predictions[i], "reference": split[i]["summary"],
             "correct": predictions[i].strip() == split[i]["summary"].strip()}
            for i in list(range(0, len(predictions), step))[:count]]


def print_summaries(console, rows: list[dict]) -> None:
    """Generated summaries (:func:`summary_rows`) beside their references (and the
    document's start)."""
    from rich.table import Table  # rich: only once a run starts

    if not rows:
        return
    table = Table(title="generated summaries", show_lines=True, title_justify="left")
    for column in ("document", "generated", "reference"):
        table.add_column(column, overflow="fold")
    for row in rows:
        document = row["document"]
        table.add_row(document[:160] + ("..." if len(document) > 160 else ""),
                      f"[{'green' if row['correct'] else 'red'}]"
                      f"{row['generated'] or '(empty)'}[/]", row["reference"])
    console.print(table)


# ----------------------------------------------------------------------------- train
def train_and_evaluate(run: runner.Run, data: runner.SavedData) -> int:
    """Model, training, evaluation, saving, verdicts (smoke and full runs alike)."""
    # transformers: only once a run starts
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    args, rt, s = run.args, run.rt, run.s
    splits = data.splits
    tokenizer = AutoTokenizer.from_pretrained(run.init_model)
    with rt.console.status(f"tokenizing {len(splits['train'])} + {len(splits['validation'])} "
                           f"documents"):
        train_t = engine.to_tensors(encode(splits["train"], tokenizer, s),
                                    ("input_ids", "attention_mask", "labels"))
        dev_t = engine.to_tensors(encode(splits["validation"], tokenizer, s),
                                  ("input_ids", "attention_mask"))

    # model: from_pretrained (smoke: saved from a T5Config just before); its size
    model = T5ForConditionalGeneration.from_pretrained(run.init_model)
    parameters = parameter_check(model)
    rt.log(f"model: {parameters['count']:,} parameters" + (
        f" ({parameters['variant']} has {parameters['expected']:,}: "
        f"{'matches' if parameters['matches'] else '[red]DOES NOT MATCH[/]'})"
        if parameters["variant"] else ""))
    ds = engine.initialize(model, run.planned.config, verbose=args.verbose)

    # train through the engine
    stats = runner.train(run, ds, train_t)

    # evaluate: greedy summaries of the validation documents, ROUGE against the references
    generated = engine.generate(ds, rt, dev_t, s.eval_batch, s.max_target_length)
    predictions = [text.strip() for text in
                   tokenizer.batch_decode(generated, skip_special_tokens=True)]
    metrics = rouge(list(splits["validation"]["summary"]), predictions)

    model_dir = engine.save_model_atomically(ds, rt, run.out_dir / "model",
                                             extra=tokenizer.save_pretrained)
    examples = summary_rows(splits["validation"], predictions, args.examples)
    return runner.conclude(
        run, stats, metrics,
        data_info={"source": data.source, "train_documents": len(splits["train"]),
                   "validation_documents": len(splits["validation"])},
        model_dir=model_dir,
        extra={"parameters": parameters, "examples": {"kind": "summaries", "rows": examples}},
        show=lambda: print_summaries(rt.console, examples))


# ----------------------------------------------------------------------------- the run
def run(args, mode: str = "smoke") -> int:
    """``dsenv smoke t5-xsum`` (synthetic documents, tiny T5) or ``dsenv run t5-xsum``
    (t5-small and XSum from the offline cache, or a save_to_disk folder: --data-dir)."""
    return runner.run(sys.modules[__name__], args, mode)
