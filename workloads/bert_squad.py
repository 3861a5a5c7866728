"""bert-squad: BERT fine-tuned for extractive question answering on SQuAD v1.1.

Through the DeepSpeed engine and any launcher. The smoke run (``dsenv smoke bert-squad``)
needs nothing from the network: a tiny BERT from a BertConfig, a WordPiece tokenizer trained
here, and a synthetic data set written as train-v1.1.json / dev-v1.1.json in SQuAD v1.1's
layout and read back like the real files. The full run (``dsenv run bert-squad``) reads
bert-base-uncased and SQuAD v1.1 from the offline cache `dsenv fetch` fills (or SQuAD's own
JSON files with --data-dir, https://rajpurkar.github.io/SQuAD-explorer/), never the
network; ``--model-dir`` evaluates a saved model on chosen dev questions.

Reads top to bottom: settings, assets, data, the model's training and evaluation, a saved
model's evaluation, the run.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.workloads import registry, report, runner, squad, tiny
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.fetch import assets
from dsenv.workloads.training import engine, runtime

NAME = "bert-squad"
THRESHOLDS = ("min_loss_drop", "min_exact_match", "min_f1")  # Settings fields
OPTIONS = {"epochs": "epochs", "max_length": "max_length",  # full runs: option -> field
           "doc_stride": "doc_stride"}
ASSETS = "generating synthetic SQuAD data, tokenizer and tiny BERT"


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings(tiny.BertSettings):  # batches and schedule: runner.Settings
    # features: the BERT SQuAD recipe's windows
    max_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    # sanity thresholds: percent, official SQuAD v1.1 EM and F1 on the dev set
    min_exact_match: float = 70.0
    min_f1: float = 80.0
    # smoke only: the synthetic task (the tiny BERT: tiny.BertSettings)
    train_paragraphs: int = 600  # x 4 questions
    dev_paragraphs: int = 100


# Full run: the BERT SQuAD recipe's windows (max length 384, stride 128) and 2 epochs, AdamW
# at 5e-5, 32 samples per device. Published bert-base-uncased on SQuAD v1.1 dev: EM 80.8,
# F1 88.5 (the BERT paper, arXiv:1810.04805); the thresholds leave room for the larger
# global batches of multi-GPU runs.
FULL = Settings(micro_batch=32, epochs=2, warmup_fraction=0.1, lr=5e-5, eval_batch=64,
                min_loss_drop=0.5, perf_key=registry.reference_key(NAME, "full"))

# Smoke thresholds, set from measured runs on a 2-core CPU (every preset, 1 and 2 ranks):
# healthy: loss 4.1 -> <0.01 (drop ~1.0), EM 95-100, F1 95-100;
# lr 0: drop 0.005, EM 0, F1 3; shuffled labels: drop 0.13, EM 4.5, F1 7.
# Thresholds sit half-way, so both sides have wide margins.
SMOKE = replace(FULL, max_length=64, doc_stride=16, max_query_length=24, micro_batch=16,
                steps=500, warmup_steps=50, lr=3e-3, min_exact_match=60.0, min_f1=65.0,
                perf_key=registry.reference_key(NAME, "smoke"))


# ----------------------------------------------------------------------------- assets
def data_files(data_dir: Path) -> tuple[Path, Path]:
    return data_dir / "train-v1.1.json", data_dir / "dev-v1.1.json"


def write_synthetic(folder: Path, s: Settings, seed: int) -> None:
    """Synthetic SQuAD: train-v1.1.json and dev-v1.1.json in SQuAD v1.1's layout."""
    train_file, dev_file = data_files(folder)
    write_json_atomically(train_file, squad.synthetic_squad(s.train_paragraphs, seed, "train"))
    write_json_atomically(dev_file, squad.synthetic_squad(s.dev_paragraphs, seed + 7919, "dev"))


def train_tokenizer(data_dir: Path, s: Settings):
    """A WordPiece tokenizer trained on the training paragraphs and questions."""
    train = squad.read_squad(data_files(data_dir)[0])
    contexts = list(dict.fromkeys(ex.context for ex in train))
    return tiny.train_wordpiece(contexts + [ex.question for ex in train], s.vocab_size)


def tiny_model(s: Settings, tokenizer):
    """The tiny BERT with a span head (answer start and end)."""
    from transformers import BertForQuestionAnswering  # transformers: only once a run starts

    return BertForQuestionAnswering(tiny.bert_config(s, tokenizer, max(128, s.max_length)))


# ----------------------------------------------------------------------------- data
@dataclass
class SquadData:
    train: list  # squad.Example
    dev: list
    info: dict  # where the data came from, for the report
    train_f: dict | None = None
    dev_f: dict | None = None
    tokenizer: object = None  # the one that made the features


def read_json_files(data_dir: Path) -> SquadData:
    """train-v1.1.json / dev-v1.1.json from a folder (SQuAD's own files, or synthetic ones)."""
    train_file, dev_file = data_files(data_dir)
    return SquadData(squad.read_squad(train_file), squad.read_squad(dev_file),
                     {"train": str(train_file), "dev": str(dev_file)})


def read_cached_dataset() -> SquadData:
    """SQuAD v1.1 as `dsenv fetch bert-squad` prepared it (save_to_disk), read offline."""
    dataset_asset = assets.asset_of(NAME, "dataset")
    splits = assets.load_dataset(NAME)
    source = f"{dataset_asset.repo} in {dataset_asset.saved_dir(assets.CacheLayout.from_env())}"
    for split in ("train", "validation"):
        if split not in splits:
            raise WorkloadError(f"{source}: no {split} split; `dsenv fetch {NAME}` again")
    return SquadData(squad.examples_from_rows(splits["train"], f"{source} (train)"),
                     squad.examples_from_rows(splits["validation"], f"{source} (validation)"),
                     {"train": f"{source} (train)", "dev": f"{source} (validation)"})


def read_data(args, mode: str, generated: Path | None) -> SquadData:
    """--data-dir's JSON files, the smoke's generated ones, or SQuAD v1.1 from the cache; a
    full run's first --max-train-samples / --max-eval-samples questions."""
    folder = Path(args.data_dir) if args.data_dir else generated
    data = read_json_files(folder) if folder else read_cached_dataset()
    if mode == "run":
        data.train = data.train[:args.max_train_samples] if args.max_train_samples else data.train
        data.dev = data.dev[:args.max_eval_samples] if args.max_eval_samples else data.dev
    return data


def make_features(data: SquadData, tokenizer, s: Settings, shuffle_labels: bool = False,
                  seed: int = 0) -> SquadData:
    data.train_f = squad.train_features(data.train, tokenizer, s.max_length, s.doc_stride,
                                        s.max_query_length)
    if shuffle_labels:  # hidden flag: a broken pipeline the sanity verdict must catch
        pairs = list(zip(data.train_f["start_positions"], data.train_f["end_positions"],
                         strict=True))
        random.Random(seed).shuffle(pairs)
        data.train_f["start_positions"] = [p[0] for p in pairs]
        data.train_f["end_positions"] = [p[1] for p in pairs]
    data.dev_f = squad.eval_features(data.dev, tokenizer, s.max_length, s.doc_stride,
                                     s.max_query_length)
    data.info.update(train_examples=len(data.train), dev_examples=len(data.dev),
                     train_features=len(data.train_f["input_ids"]),
                     dev_features=len(data.dev_f["input_ids"]),
                     labels_shuffled=bool(shuffle_labels))
    return data


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer  # transformers: only once a run starts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not tokenizer.is_fast:  # answer offsets need the fast (Rust) tokenizer
        raise WorkloadError(f"{model_dir}: the tokenizer has no fast version (tokenizer.json); "
                            "SQuAD answer offsets need one")
    return tokenizer


def prepare(data: SquadData, init_model: Path, s: Settings, args) -> SquadData:
    """The questions and paragraphs as windows, with the model's tokenizer."""
    data.tokenizer = load_tokenizer(init_model)
    return make_features(data, data.tokenizer, s, getattr(args, "shuffle_labels", False),
                         args.seed)


def preparing(data: SquadData, s: Settings) -> str:
    return (f"tokenizing {len(data.train)} + {len(data.dev)} questions (max length "
            f"{s.max_length}, stride {s.doc_stride})")


def samples(data: SquadData, s: Settings) -> tuple[int, str, str]:
    """The training windows a full run plans its steps over."""
    return len(data.train_f["input_ids"]), "training windows", "windows"


def settled(s: Settings) -> Settings:
    """A shorter window keeps room for the paragraph: questions get at most a third of it."""
    return replace(s, max_query_length=min(s.max_query_length, s.max_length // 3))


# ----------------------------------------------------------------------------- train
def train_and_evaluate(run: runner.Run, data: SquadData) -> int:
    """Model, training, evaluation, saving, verdicts (smoke and full runs alike)."""
    from transformers import BertForQuestionAnswering  # transformers: only once a run starts

    args, rt, s = run.args, run.rt, run.s
    keys = ("input_ids", "token_type_ids", "attention_mask")
    train_t = engine.to_tensors(data.train_f, keys + ("start_positions", "end_positions"))
    dev_t = engine.to_tensors(data.dev_f, keys)

    # model: loaded through from_pretrained (smoke: saved from a BertConfig just before)
    model = BertForQuestionAnswering.from_pretrained(run.init_model)
    ds = engine.initialize(model, run.planned.config, verbose=args.verbose)

    # train through the engine
    stats = runner.train(run, ds, train_t)

    # evaluate: the official SQuAD v1.1 metric on the dev set
    logits = engine.predict(ds, rt, dev_t, s.eval_batch)
    answers = squad.best_answers(data.dev, data.dev_f, logits["start_logits"],
                                 logits["end_logits"])
    metrics = squad.squad_scores(data.dev, {qid: text for qid, (text, _) in answers.items()})

    # save the model atomically, with what evaluating it later needs; verdicts; report
    def save_extras(folder: Path) -> None:
        data.tokenizer.save_pretrained(folder)
        write_json_atomically(folder / FEATURES_FILE, {
            "max_length": s.max_length, "doc_stride": s.doc_stride,
            "max_query_length": s.max_query_length})

    model_dir = engine.save_model_atomically(ds, rt, run.out_dir / "model", extra=save_extras)
    examples = squad.example_rows(data.dev, answers, count=args.examples)
    return runner.conclude(
        run, stats, metrics, data_info=data.info, model_dir=model_dir,
        extra={"examples": {"kind": "qa", "rows": examples}},
        show=lambda: squad.print_examples(rt.console, examples))


# ----------------------------------------------------------------------------- evaluate
FEATURES_FILE = "dsenv-features.json"  # the windowing a saved model was trained with


def load_saved_model(model_dir: Path):
    """(model, tokenizer, windowing) of a folder a run saved; one clear error otherwise."""
    # transformers: only once a run starts
    from transformers import AutoConfig, BertForQuestionAnswering

    hint = "pass the `model` folder a run wrote (OUTPUT_DIR/model)"
    if not model_dir.is_dir():
        raise WorkloadError(f"--model-dir {model_dir}: no such folder; {hint}")
    if not (model_dir / "config.json").is_file():
        raise WorkloadError(f"--model-dir {model_dir}: not a saved model (no config.json); "
                            f"{hint}")
    try:
        config = AutoConfig.from_pretrained(model_dir)
        model = BertForQuestionAnswering.from_pretrained(model_dir)
        tokenizer = load_tokenizer(model_dir)
    except (OSError, ValueError, KeyError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkloadError(f"--model-dir {model_dir}: cannot load it as a BERT question-"
                            f"answering model ({first_line}); {hint}") from None
    windowing = {"max_length": min(FULL.max_length, config.max_position_embeddings),
                 "doc_stride": FULL.doc_stride, "max_query_length": FULL.max_query_length}
    if (model_dir / FEATURES_FILE).is_file():
        try:
            saved = read_json(model_dir / FEATURES_FILE, "windowing file")
        except JsonFileError as exc:
            raise WorkloadError(str(exc)) from None
        windowing.update({k: v for k, v in saved.items() if k in windowing})
    return model, tokenizer, windowing


def evaluate_saved(args) -> int:
    """A saved model on dev questions K..K+N-1, each printed with its answer highlighted,
    then exact match and F1 over them."""
    wall_start = time.perf_counter()
    assets.force_offline()
    runner.reject_options(args, NAME)
    model_dir = Path(args.model_dir)
    data = read_json_files(Path(args.data_dir)) if args.data_dir else read_cached_dataset()
    start, count = args.start_sample, args.num_test_samples
    if start >= len(data.dev):
        raise WorkloadError(f"--start-sample {start}: the dev set has {len(data.dev)} "
                            f"questions (0..{len(data.dev) - 1})")
    data.dev = data.dev[start:start + count]

    rt = runtime.start()
    if rt.world_size > 1:
        raise WorkloadError("--model-dir evaluation runs as one process; run it without a "
                            "launcher")
    runner.quiet_transformers()
    model, tokenizer, windowing = load_saved_model(model_dir)
    s = replace(FULL, **windowing)
    data.dev_f = squad.eval_features(data.dev, tokenizer, s.max_length, s.doc_stride,
                                     s.max_query_length)
    logits = engine.predict(model.to(rt.device), rt,
                            engine.to_tensors(data.dev_f, ("input_ids", "token_type_ids",
                                                           "attention_mask")), s.eval_batch)
    answers = squad.best_answers(data.dev, data.dev_f, logits["start_logits"],
                                 logits["end_logits"])
    metrics = squad.squad_scores(data.dev, {qid: text for qid, (text, _) in answers.items()})
    squad.print_examples(rt.console, squad.example_rows(data.dev, answers, len(data.dev)))
    rt.log(f"[bold]{len(data.dev)} dev questions {start}..{start + len(data.dev) - 1}[/] of "
           f"{data.info['dev']}: exact match {metrics['exact_match']:.1f}, "
           f"F1 {metrics['f1']:.1f} (official SQuAD v1.1)")
    report_path = (Path(args.report) if args.report
                   else Path(args.output_dir).resolve() / "evaluate.json")
    report.write_report(report_path, {
        "report_version": report.REPORT_VERSION, "workload": NAME, "mode": "evaluate",
        "model_dir": str(model_dir.resolve()), "data": data.info, "windowing": windowing,
        "start_sample": start, "num_test_samples": len(data.dev), "metrics": metrics,
        "predictions": {qid: text for qid, (text, _) in answers.items()},
        "versions": runtime.versions(), "run": rt.describe(),
        "wall_s": time.perf_counter() - wall_start})
    rt.log(f"report: {report_path}")
    return 0


# ----------------------------------------------------------------------------- the run
def run(args, mode: str = "smoke") -> int:
    """``dsenv smoke bert-squad`` (synthetic SQuAD, tiny BERT), ``dsenv run bert-squad``
    (bert-base-uncased and SQuAD v1.1 from the offline cache, or --data-dir JSON files), or
    with --model-dir the evaluation of a saved model."""
    if mode == "run" and args.model_dir:
        return evaluate_saved(args)
    return runner.run(sys.modules[__name__], args, mode)
