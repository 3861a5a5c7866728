"""bert-mrpc: BERT fine-tuned to classify GLUE MRPC sentence pairs (paraphrase or not).

Through the DeepSpeed engine and any launcher, with two ways to use several ranks:

* synced (default): one model, gradients all-reduced every step; ``--lr-scaling sqrt``
  scales the learning rate with the square root of the larger global batch;
* ``--no-sync-gradients``: every rank trains its own model on the whole training set in its
  own order, with no gradient all-reduce (workers training independently), each is
  evaluated on the whole validation set, and the best one (accuracy, then F1) is kept,
  saved and reported, beside every rank's scores and weight digest.

The smoke (``dsenv smoke bert-mrpc``) needs nothing from the network: a tiny BERT from a
BertConfig, a WordPiece tokenizer trained here, and synthetic sentence pairs in MRPC's
layout (sentence1, sentence2, label, idx) saved with save_to_disk and read back with
load_from_disk. The full run (``dsenv run bert-mrpc``) fine-tunes bert-base-uncased on
GLUE MRPC from the offline cache (`dsenv fetch bert-mrpc`) with the BERT paper's recipe
(length 128, batch 32, AdamW 2e-5, 3 epochs; arXiv:1810.04805). Metrics: accuracy and F1 of
the "equivalent" class, as GLUE reports MRPC (gluebenchmark.com).

Reads top to bottom: settings, assets, data, evaluation, the model's training, the run.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.workloads import registry, runner, synthetic, tiny
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.training import dsconfig, engine, runtime

NAME = "bert-mrpc"
COLUMNS = ("sentence1", "sentence2", "label", "idx")
SPLITS = ("train", "validation")
THRESHOLDS = ("min_loss_drop", "min_accuracy", "min_f1")  # Settings fields
MRPC_LABELS = synthetic.MRPC["label_names"]  # GLUE's ClassLabel names: 0, 1
OPTIONS = {"epochs": "epochs", "max_length": "max_length"}  # full runs: option -> field
ASSETS = "generating synthetic MRPC pairs, tokenizer and tiny BERT"


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings(tiny.BertSettings):  # batches and schedule: runner.Settings
    max_length: int = 128  # tokens of a sentence pair
    # sanity thresholds, percent on the validation pairs
    min_accuracy: float = 78.0
    min_f1: float = 84.0
    # smoke only: the synthetic pairs (the tiny BERT: tiny.BertSettings)
    train_pairs: int = 4000
    dev_pairs: int = 400  # validation and test each


# Full run: bert-base-uncased, the BERT paper's MRPC recipe. Published dev figures: accuracy
# 84-87, F1 88-90; the thresholds leave room for larger global batches and unsynced workers.
FULL = Settings(micro_batch=32, epochs=3, warmup_fraction=0.1, lr=2e-5, eval_batch=64,
                min_loss_drop=0.3, perf_key=registry.reference_key(NAME, "full"))

# Smoke thresholds, from measured runs on the 2-core CPU (bench/RESULTS.md): healthy runs
# reach accuracy and F1 ~99; lr 0 stays at chance (accuracy ~50, F1 0 or ~67).
SMOKE = replace(FULL, max_length=32, steps=400, warmup_steps=40, lr=2e-3, min_loss_drop=0.5,
                min_accuracy=80.0, min_f1=80.0, perf_key=registry.reference_key(NAME, "smoke"))


def check(args) -> None:
    """--no-sync-gradients needs a preset without ZeRO: said before anything starts."""
    stage = dsconfig.zero_stage(args.preset, args.deepspeed_config)
    if args.no_sync_gradients and stage:
        raise WorkloadError(
            f"--no-sync-gradients trains one model per rank: it needs a preset without ZeRO "
            f"(fp32, bf16, fp16), not {args.preset} (ZeRO stage {stage})")


# ----------------------------------------------------------------------------- assets
def write_synthetic(folder: Path, s: Settings, seed: int) -> None:
    """Synthetic MRPC: sentence pairs in GLUE MRPC's layout."""
    synthetic.save_task(folder, "mrpc", s.train_pairs, s.dev_pairs, seed)


def train_tokenizer(data_dir: Path, s: Settings):
    """A WordPiece tokenizer trained on the training sentences."""
    train = runner.load_saved(data_dir, COLUMNS, SPLITS)["train"]
    return tiny.train_wordpiece(list(train["sentence1"]) + list(train["sentence2"]),
                                s.vocab_size)


def tiny_model(s: Settings, tokenizer):
    """The tiny BERT with a two-class head (equivalent or not)."""
    from transformers import BertForSequenceClassification  # transformers: only once a run starts

    return BertForSequenceClassification(
        tiny.bert_config(s, tokenizer, max(64, s.max_length), num_labels=2))


# ----------------------------------------------------------------------------- data
def samples(data: runner.SavedData, s: Settings) -> tuple[int, str, str]:
    """The sentence pairs a full run plans its steps over."""
    return len(data.splits["train"]), "sentence pairs", "pairs"


def encode(split, tokenizer, s: Settings) -> dict:
    """The pairs as BERT reads them ([CLS] sentence1 [SEP] sentence2 [SEP]) and labels."""
    enc = tokenizer(list(split["sentence1"]), list(split["sentence2"]), max_length=s.max_length,
                    truncation=True, padding="max_length")
    return {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"],
            "attention_mask": enc["attention_mask"], "labels": list(split["label"])}


# ----------------------------------------------------------------------------- evaluate
def scores(labels: list[int], predicted: list[int]) -> dict[str, float]:
    """Accuracy and F1 of the positive ("equivalent") class, in percent, as GLUE has them."""
    pairs = list(zip(labels, predicted, strict=True))
    tp = sum(1 for y, p in pairs if y == 1 and p == 1)
    fp = sum(1 for y, p in pairs if y == 0 and p == 1)
    fn = sum(1 for y, p in pairs if y == 1 and p == 0)
    accuracy = 100.0 * sum(1 for y, p in pairs if y == p) / max(len(pairs), 1)
    f1 = 100.0 * 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {"accuracy": accuracy, "f1": f1}


def pair_rows(split, predicted: list[int], count: int, names: list[str]) -> list[dict]:
    """``count`` classified pairs spread over the set: both sentences, the prediction and
    the label (printed, and in the report for its HTML page)."""
    if count <= 0:
        return []
    step = max(1, len(predicted) // count)
    return [{"sentence1": split[i]["sentence1"], "sentence2": split[i]["sentence2"],
             "predicted": names[predicted[i]], "label": names[split[i]["label"]],
             "correct": predicted[i] == split[i]["label"]}
            for i in list(range(0, len(predicted), step))[:count]]


def print_pairs(console, rows: list[dict]) -> None:
    """Classified pairs (:func:`pair_rows`): both sentences, the prediction and the label."""
    from rich.table import Table  # rich: only once a run starts

    if not rows:
        return
    table = Table(title="classified pairs", show_lines=True, title_justify="left")
    for column in ("sentence1", "sentence2", "predicted", "label"):
        table.add_column(column, overflow="fold")
    for row in rows:
        colour = "green" if row["correct"] else "red"
        table.add_row(row["sentence1"], row["sentence2"], f"[{colour}]{row['predicted']}[/]",
                      row["label"])
    console.print(table)


def print_ranks(console, ranks: list[dict], best: int) -> None:
    """Every independently trained rank's scores; the kept one marked."""
    for entry in ranks:
        mark = "[bold green]kept[/]" if entry["rank"] == best else ""
        console.print(f"rank {entry['rank']}: accuracy {entry['accuracy']:.1f}, F1 "
                      f"{entry['f1']:.1f}, loss {entry['loss_last']:.3f}, weights "
                      f"{(entry['weights_sha256'] or '-')[:12]} {mark}", highlight=False)


# ----------------------------------------------------------------------------- train
def train_and_evaluate(run: runner.Run, data: runner.SavedData) -> int:
    """Model, training, evaluation, saving, verdicts (smoke and full runs alike)."""
    # transformers: only once a run starts
    from transformers import AutoTokenizer, BertForSequenceClassification

    args, rt, s = run.args, run.rt, run.s
    synced = not args.no_sync_gradients
    if not synced:
        run = replace(run, planned=dsconfig.without_gradient_sync(run.planned))
    splits = data.splits
    tokenizer = AutoTokenizer.from_pretrained(run.init_model)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    train_t = engine.to_tensors(encode(splits["train"], tokenizer, s), keys + ("labels",))
    dev_t = engine.to_tensors(encode(splits["validation"], tokenizer, s), keys)
    names = getattr(splits["train"].features["label"], "names", None) or MRPC_LABELS

    # model: from_pretrained (full: bert-base-uncased, with a new classification head)
    model = BertForSequenceClassification.from_pretrained(
        run.init_model, num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)})
    ds = engine.initialize(model, run.planned.config, verbose=args.verbose,
                           sync_gradients=synced)

    # train through the engine: one model, or one per rank on its own batches
    stats = runner.train(run, ds, train_t, independent=not synced)

    # evaluate every rank's model; keep the best (the same model on every rank when synced)
    logits = engine.predict(ds, rt, dev_t, s.eval_batch, outputs=("logits",),
                            split_over_ranks=synced)["logits"]
    predicted = [int(i) for i in logits.argmax(-1)]
    mine = scores(list(splits["validation"]["label"]), predicted)
    digest = engine.weights_digest(ds.module) if ds.zero_optimization_stage() < 3 else None
    ranks = runtime.gather(rt, {"rank": rt.rank, **mine, "loss_last": stats.loss_curve[-1],
                                "weights_sha256": digest, "loss_curve": stats.loss_curve,
                                "predicted": predicted})
    best = max(ranks, key=lambda r: (r["accuracy"], r["f1"], -r["rank"]))
    model_dir = engine.save_model_atomically(ds, rt, run.out_dir / "model",
                                             extra=tokenizer.save_pretrained,
                                             source_rank=best["rank"])
    stats = replace(stats, loss_curve=best["loss_curve"])

    examples = pair_rows(splits["validation"], best["predicted"], args.examples, names)

    def show() -> None:
        print_pairs(rt.console, examples)
        if not synced:
            print_ranks(rt.console, ranks, best["rank"])

    return runner.conclude(
        run, stats, {"accuracy": best["accuracy"], "f1": best["f1"]},
        data_info={"source": data.source, "train_pairs": len(splits["train"]),
                   "validation_pairs": len(splits["validation"])},
        model_dir=model_dir, show=show,
        extra={"examples": {"kind": "pairs", "rows": examples},
               "gradient_sync": synced, "best_rank": best["rank"],
               "ranks": [{k: r[k] for k in ("rank", "accuracy", "f1", "loss_last",
                                            "weights_sha256")} for r in ranks]})


# ----------------------------------------------------------------------------- the run
def run(args, mode: str = "smoke") -> int:
    """``dsenv smoke bert-mrpc`` (synthetic pairs, tiny BERT) or ``dsenv run bert-mrpc``
    (bert-base-uncased and GLUE MRPC from the offline cache, or --data-dir)."""
    return runner.run(sys.modules[__name__], args, mode)
