"""bert-squad: BERT fine-tuned for extractive question answering on SQuAD v1.1.

Seeds 000 and 001 (LUMI, Piz Daint), through the DeepSpeed engine and any launcher.
The smoke run (``dsenv smoke bert-squad``) needs nothing from the network: a tiny BERT from
a BertConfig, a WordPiece tokenizer trained here, and a synthetic data set written as
train-v1.1.json / dev-v1.1.json in SQuAD v1.1's layout and read back like the real files.
The full run (``dsenv run bert-squad``) reads bert-base-uncased and SQuAD v1.1 from the
offline cache `dsenv fetch` fills (or the seeds' JSON files with --data-dir), never the
network; ``--model-dir`` evaluates a saved model on chosen dev questions (seed 001).

Reads top to bottom: settings, assets, data, runs (model, train, evaluate, report).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from dsenv.workloads import assets, dsconfig, engine, report, runner, squad
from dsenv.workloads.launch_env import WorkloadError

from dsenv.jsonfiles import JsonFileError, read_json, write_json_atomically
from dsenv.staging import staged_dir

NAME = "bert-squad"
OTHER_OPTIONS = {"no_sync_gradients": "--no-sync-gradients"}  # other workloads' options
THRESHOLDS = ("min_loss_drop", "min_exact_match", "min_f1")  # Settings fields


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    # features: the BERT SQuAD recipe's windows
    max_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    # training: steps, or epochs when steps is 0
    micro_batch: int = 32
    steps: int = 0
    epochs: int = 2
    warmup_steps: int = 0  # linear warm-up, then linear decay; excluded from throughput
    warmup_fraction: float = 0.1  # when warmup_steps is 0
    lr: float = 5e-5
    eval_batch: int = 64
    # sanity thresholds
    min_loss_drop: float = 0.5  # final loss at most half the initial one
    min_exact_match: float = 70.0  # percent, official SQuAD v1.1 EM on the dev set
    min_f1: float = 80.0
    perf_key: str = "bert-squad-full"
    # smoke only: the synthetic task and the tiny model built from a BertConfig
    train_paragraphs: int = 600  # x 4 questions
    dev_paragraphs: int = 100
    vocab_size: int = 800
    hidden_size: int = 64
    layers: int = 2
    heads: int = 2
    intermediate_size: int = 128
    dropout: float = 0.0
    init_range: float = 0.1  # BERT's 0.02 leaves a tiny model on a long plateau (measured)


# Full run: seeds 000/001's recipe (AdamW lr 5e-5, 2 epochs, max length 384, stride 128) at
# 32 samples per device. Published bert-base-uncased on SQuAD v1.1 dev: EM 80.8, F1 88.5;
# the thresholds leave room for the larger global batches of multi-GPU runs.
FULL = Settings()

# Smoke thresholds, set from measured runs on a 2-core CPU (every preset, 1 and 2 ranks):
# healthy: loss 4.1 -> <0.01 (drop ~1.0), EM 95-100, F1 95-100;
# lr 0: drop 0.005, EM 0, F1 3; shuffled labels: drop 0.13, EM 4.5, F1 7.
# Thresholds sit half-way, so both sides have wide margins.
SMOKE = replace(FULL, max_length=64, doc_stride=16, max_query_length=24, micro_batch=16,
                steps=500, warmup_steps=50, lr=3e-3, min_exact_match=60.0, min_f1=65.0,
                perf_key="bert-squad-smoke")


# ----------------------------------------------------------------------------- assets
def data_files(data_dir: Path) -> tuple[Path, Path]:
    return data_dir / "train-v1.1.json", data_dir / "dev-v1.1.json"


def make_smoke_assets(root: Path, s: Settings, seed: int, data_dir: Path | None) -> None:
    """Rank 0: the synthetic SQuAD files (unless ``data_dir`` has real ones), a tokenizer
    trained on the training file, and the initial model, all saved to disk."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    if data_dir is None:
        data_dir = root / "data"
        write_json_atomically(data_dir / "train-v1.1.json",
                                    squad.synthetic_squad(s.train_paragraphs, seed, "train"))
        write_json_atomically(data_dir / "dev-v1.1.json",
                                    squad.synthetic_squad(s.dev_paragraphs, seed + 7919, "dev"))
    train = squad.read_squad(data_files(data_dir)[0])
    contexts = list(dict.fromkeys(ex.context for ex in train))
    texts = contexts + [ex.question for ex in train]
    tokenizer = runner.train_wordpiece(texts, s.vocab_size)

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=s.hidden_size,
                        num_hidden_layers=s.layers, num_attention_heads=s.heads,
                        intermediate_size=s.intermediate_size,
                        max_position_embeddings=max(128, s.max_length),
                        hidden_dropout_prob=s.dropout, attention_probs_dropout_prob=s.dropout,
                        initializer_range=s.init_range)
    model = BertForQuestionAnswering(config)
    with staged_dir(root / "init-model") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


# ----------------------------------------------------------------------------- data
@dataclass
class SquadData:
    train: list  # squad.Example
    dev: list
    info: dict  # where the data came from, for the report
    train_f: dict | None = None
    dev_f: dict | None = None


def read_json_files(data_dir: Path) -> SquadData:
    """train-v1.1.json / dev-v1.1.json from a folder (the seeds' files, or synthetic ones)."""
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


def make_features(data: SquadData, tokenizer, s: Settings, shuffle_labels: bool = False,
                  seed: int = 0) -> SquadData:
    data.train_f = squad.train_features(data.train, tokenizer, s.max_length, s.doc_stride,
                                        s.max_query_length)
    if shuffle_labels:  # hidden flag: a broken pipeline the sanity verdict must catch
        import random

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
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not tokenizer.is_fast:  # answer offsets need the fast (Rust) tokenizer
        raise WorkloadError(f"{model_dir}: the tokenizer has no fast version (tokenizer.json); "
                            "SQuAD answer offsets need one")
    return tokenizer


# ----------------------------------------------------------------------------- runs
def run(args, mode: str = "smoke") -> int:
    if mode == "smoke":
        return run_smoke(args)
    if args.model_dir:
        return evaluate_saved(args)
    return run_full(args)


def run_smoke(args) -> int:
    """Synthetic data, tokenizer and tiny BERT made here; everything else as a full run."""
    wall_start = time.perf_counter()
    s = runner.smoke_settings(args, SMOKE)
    out_dir = Path(args.output_dir).resolve()
    runner.reject_options(args, NAME, OTHER_OPTIONS)
    dsconfig.check_inputs(args.preset, args.deepspeed_config)  # bad input fails in 0.1 s
    user_data = Path(args.data_dir) if args.data_dir else None
    if user_data is not None:  # fail before any engine starts
        read_json_files(user_data)
    rt, planned, timings = runner.begin_smoke(args, NAME, s)

    # assets: rank 0 writes them, everyone reads them back the way real ones are read
    smoke_assets = out_dir / "assets"
    runner.on_main(rt, "generating synthetic SQuAD data, tokenizer and tiny BERT",
                   lambda: make_smoke_assets(smoke_assets, s, args.seed, user_data))
    init_model = smoke_assets / "init-model"
    tokenizer = load_tokenizer(init_model)
    data = make_features(read_json_files(user_data or smoke_assets / "data"), tokenizer, s,
                         getattr(args, "shuffle_labels", False), args.seed)
    return train_evaluate_report(args, "smoke", rt, s, planned, timings, init_model,
                                 tokenizer, data, wall_start)


def run_full(args) -> int:
    """bert-base-uncased and SQuAD v1.1 from the offline cache (or --data-dir JSON files)."""
    wall_start = time.perf_counter()
    assets.force_offline()
    s = replace(FULL, **{key: value for key, value in (
        ("epochs", args.epochs), ("max_length", args.max_length),
        ("doc_stride", args.doc_stride)) if value})
    # a shorter window keeps room for the paragraph: questions get at most a third of it
    s = replace(s, max_query_length=min(s.max_query_length, s.max_length // 3))
    runner.reject_options(args, NAME, OTHER_OPTIONS)
    dsconfig.check_inputs(args.preset, args.deepspeed_config)
    # every input is checked before an engine starts: a missing asset is one line, at once
    init_model = assets.model_path(NAME)
    data = read_json_files(Path(args.data_dir)) if args.data_dir else read_cached_dataset()
    data.train = data.train[:args.max_train_samples] if args.max_train_samples else data.train
    data.dev = data.dev[:args.max_eval_samples] if args.max_eval_samples else data.dev

    rt = engine.start()
    runner.quiet_transformers()
    tokenizer = load_tokenizer(init_model)
    planned = runner.plan(args, rt, s, scheduled=False)
    with rt.console.status(f"tokenizing {len(data.train)} + {len(data.dev)} questions "
                           f"(max length {s.max_length}, stride {s.doc_stride})"):
        make_features(data, tokenizer, s)
    steps, warmup = runner.planned_steps(s, len(data.train_f["input_ids"]),
                                         planned.batch.micro_batch, planned.batch.grad_accum,
                                         rt.world_size, args.max_steps, "training windows")
    s = replace(s, steps=steps, warmup_steps=warmup)
    planned = dsconfig.with_schedule(planned, warmup, steps)
    timings = runner.launch(args, rt, NAME, "run", planned, f"{steps} steps ({s.epochs} epochs"
                            f"{', capped by --max-steps' if args.max_steps else ''}) over "
                            f"{data.info['train_features']} windows")
    return train_evaluate_report(args, "run", rt, s, planned, timings, init_model, tokenizer,
                                 data, wall_start)


def train_evaluate_report(args, mode: str, rt, s: Settings, planned, timings: dict,
                          init_model: Path, tokenizer, data: SquadData,
                          wall_start: float) -> int:
    """What smoke and full runs share: model, training, evaluation, saving, verdicts."""
    out_dir = Path(args.output_dir).resolve()
    keys = ("input_ids", "token_type_ids", "attention_mask")
    train_t = engine.to_tensors(data.train_f, keys + ("start_positions", "end_positions"))
    dev_t = engine.to_tensors(data.dev_f, keys)

    # model: loaded through from_pretrained (smoke: saved from a BertConfig just before)
    from transformers import BertForQuestionAnswering

    model = BertForQuestionAnswering.from_pretrained(init_model)
    ds = engine.initialize(model, planned.config, verbose=args.verbose)

    # train through the engine
    import torch

    torch.manual_seed(args.seed)
    batches = engine.micro_batches(train_t, planned.batch.micro_batch, rt, args.seed)
    stats = engine.train(ds, rt, batches, s.steps, s.warmup_steps, label="training")

    # evaluate: the official SQuAD v1.1 metric on the dev set
    logits = engine.predict(ds, rt, dev_t, s.eval_batch)
    answers = squad.best_answers(data.dev, data.dev_f, logits["start_logits"],
                                 logits["end_logits"])
    metrics = squad.squad_scores(data.dev, {qid: text for qid, (text, _) in answers.items()})

    # save the model atomically, with what evaluating it later needs; verdicts; report
    def save_extras(folder: Path) -> None:
        tokenizer.save_pretrained(folder)
        write_json_atomically(folder / FEATURES_FILE, {
            "max_length": s.max_length, "doc_stride": s.doc_stride,
            "max_query_length": s.max_query_length})

    model_dir = engine.save_model_atomically(ds, rt, out_dir / "model", extra=save_extras)
    return runner.conclude(
        args, NAME, mode, rt, s, planned, timings, stats, metrics,
        runner.thresholds(s, THRESHOLDS), init_model=init_model,
        data_info=data.info, wall_start=wall_start, model_dir=model_dir,
        show=lambda: squad.print_examples(rt.console, data.dev, answers, count=args.examples))


# ----------------------------------------------------------------------------- evaluate
FEATURES_FILE = "dsenv-features.json"  # the windowing a saved model was trained with


def load_saved_model(model_dir: Path):
    """(model, tokenizer, windowing) of a folder a run saved; one clear error otherwise."""
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
    """Seed 001's test script: a saved model on dev samples K..K+N, answers highlighted."""
    wall_start = time.perf_counter()
    assets.force_offline()
    runner.reject_options(args, NAME, OTHER_OPTIONS)
    model_dir = Path(args.model_dir)
    data = read_json_files(Path(args.data_dir)) if args.data_dir else read_cached_dataset()
    start, count = args.start_sample, args.num_test_samples
    if start >= len(data.dev):
        raise WorkloadError(f"--start-sample {start}: the dev set has {len(data.dev)} "
                            f"questions (0..{len(data.dev) - 1})")
    data.dev = data.dev[start:start + count]

    rt = engine.start()
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
    squad.print_examples(rt.console, data.dev, answers, count=len(data.dev))
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
        "versions": engine.versions(), "run": rt.describe(),
        "wall_s": time.perf_counter() - wall_start})
    rt.log(f"report: {report_path}")
    return 0
