"""What the bundled workloads share around the engine, so each reads top to bottom as data,
model, train, evaluate, report in a few lines of its own:

    s = runner.smoke_settings(args, SMOKE)               # hidden --steps for tests
    rt, planned, timings = runner.begin_smoke(args, NAME, s)  # ranks, config, first line
    runner.on_main(rt, "generating ...", make_assets)    # rank 0, then every rank goes on
    data = runner.load_saved(folder, COLUMNS, SPLITS)    # load_from_disk, columns checked
    ...                                                  # the workload's own model and loop
    return runner.conclude(args, NAME, "smoke", rt, s, planned, timings, stats, metrics,
                           runner.thresholds(s, THRESHOLDS), ...)   # verdicts, report, exit

Also here: tokenizers trained on the smoke's own text (WordPiece for BERT, byte-level BPE
for GPT-2, Unigram for T5, each wrapped as the model's transformers tokenizer), the step
plan of full runs, and the one line that opens a run. torch, transformers, tokenizers and
datasets are imported inside the functions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dsenv.workloads import dsconfig, engine, report
from dsenv.workloads.launch_env import WorkloadError


# ----------------------------------------------------------------------------- tokenizers
def train_wordpiece(texts: list[str], vocab_size: int):
    """A lower-casing WordPiece tokenizer trained here, as a transformers BertTokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, show_progress=False,
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    wordpiece.train_from_iterator(texts, trainer)
    return BertTokenizer(vocab=wordpiece.get_vocab())


def train_byte_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained here (GPT-2's kind), as a GPT2Tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return GPT2Tokenizer(vocab=model["vocab"], merges=merges)


def train_unigram(texts: list[str], vocab_size: int):
    """A SentencePiece-style Unigram vocabulary estimated here (T5's kind), as a T5Tokenizer:
    <pad> 0 (also the decoder start), </s> 1 appended to every text, <unk> 2.

    The pieces are the corpus's most frequent words, marked "▁" at the word start as
    SentencePiece does, scored by their log frequency, plus every character seen (alone and
    word-initial) so that any text still encodes. tokenizers' UnigramTrainer is not used:
    on a corpus of ~300 distinct words it prunes down to sub-word fragments ("▁liv", "e",
    "s": measured), doubling the sequence length for nothing.
    """
    import collections
    import math

    from transformers import T5Tokenizer

    words = collections.Counter(word for text in texts for word in text.split())
    chars = collections.Counter(ch for word, count in words.items() for ch in word
                                for _ in range(count))
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    singles = sorted({piece for ch in chars for piece in (ch, "\u2581" + ch)} | {"\u2581"})
    room = max(vocab_size - len(specials) - len(singles), 0)
    total = sum(words.values())
    pieces = [("\u2581" + word, math.log(count / total))
              for word, count in words.most_common(room) if len(word) > 1]
    floor = min((score for _, score in pieces), default=0.0) - 10.0  # characters: last resort
    pieces += [(piece, floor) for piece in singles]
    return T5Tokenizer(vocab=specials + pieces, extra_ids=0)


# ----------------------------------------------------------------------------- options
def reject_options(args, name: str, options: dict[str, str]) -> None:
    """One line for a command-line option this workload does not have (``options``: the
    argparse destination -> the flag as typed), before anything starts."""
    for dest, flag in options.items():
        if getattr(args, dest, None):
            raise WorkloadError(f"{flag} is not an option of {name}")


def require(name: str, packages: dict[str, str]) -> None:
    """One line naming what to install when a package this workload imports is missing
    (``packages``: module -> distribution), before anything starts."""
    import importlib.util

    missing = [dist for module, dist in packages.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        raise WorkloadError(f"{name} needs {', '.join(missing)}: pip install "
                            f"{' '.join(missing)} (in dsenv's `train` extra)")


def smoke_settings(args, smoke):
    """The smoke's settings, shortened by the hidden ``--steps`` (tests)."""
    steps = getattr(args, "steps", None)
    return replace(smoke, steps=steps, warmup_steps=max(1, steps // 10)) if steps else smoke


def thresholds(s, names: tuple[str, ...]) -> dict[str, float]:
    """The sanity thresholds among a workload's settings (``min_<metric>``: a floor,
    ``max_<metric>``: a ceiling; ``min_loss_drop``: the fraction the loss must fall by)."""
    return {name: getattr(s, name) for name in names}


def planned_steps(s, train_samples: int, micro_batch: int, grad_accum: int, world_size: int,
                  max_steps: int | None = None, what: str = "training samples",
                  per_rank_data: bool = False) -> tuple[int, int]:
    """(optimizer steps, warm-up steps): ``s.steps``, else ``s.epochs`` over this data set
    (split over the ranks unless ``per_rank_data``: every rank reads all of it), capped by
    ``max_steps``; warm-up ``s.warmup_steps``, else ``s.warmup_fraction`` of the steps."""
    steps = s.steps
    if not steps:
        ranks = 1 if per_rank_data else world_size
        per_epoch = train_samples // ranks // micro_batch // grad_accum
        if per_epoch < 1:
            raise WorkloadError(f"{train_samples} {what} are too few for one step of micro-batch "
                                f"{micro_batch} x grad-accum {grad_accum} x world size "
                                f"{world_size}")
        steps = s.epochs * per_epoch
    if max_steps:
        steps = min(steps, max_steps)
    warmup = s.warmup_steps or max(1, round(steps * s.warmup_fraction))
    return steps, min(warmup, max(steps - 1, 1))


# ----------------------------------------------------------------------------- a run
def quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def plan(args, rt, s, scheduled: bool = True) -> dsconfig.PlannedConfig:
    """The DeepSpeed config of this run: the preset, the user's ds_config, the command line
    and the workload's defaults; with the warm-up/decay schedule over ``s.steps`` when
    ``scheduled`` (full runs add it once the data has told the step count)."""
    return dsconfig.build_config(
        args.preset, rt.world_size, on_gpu=rt.on_gpu, default_micro_batch=s.micro_batch,
        default_lr=s.lr, micro_batch=args.micro_batch, grad_accum=args.grad_accum,
        lr=args.lr, lr_scaling=args.lr_scaling, user_config=args.deepspeed_config,
        warmup_steps=s.warmup_steps, total_steps=s.steps if scheduled else None)


def announce(rt, name: str, mode: str, planned, extra: str = "") -> None:
    rt.log(f"[bold]dsenv {mode} {name}[/]: {rt.ranks.launcher}, world size {rt.world_size}, "
           f"{rt.backend} on {rt.device_type}; preset {planned.preset}; global batch "
           f"{planned.batch.describe()}" + (f"; {extra}" if extra else ""))


def launch(args, rt, name: str, mode: str, planned, extra: str = "") -> dict:
    """The run's first line, then torch.distributed (JIT builds announced). Timings."""
    announce(rt, name, mode, planned, extra)
    return engine.init_distributed(rt, planned.config, verbose=args.verbose)


def begin_smoke(args, name: str, s) -> tuple:
    """(rt, planned, timings) of a smoke: ranks and device, the scheduled config, the first
    line, torch.distributed."""
    rt = engine.start()
    quiet_transformers()
    planned = plan(args, rt, s)
    return rt, planned, launch(args, rt, name, "smoke", planned)


def on_main(rt, message: str, make: Callable[[], object]) -> None:
    """``make()`` on rank 0 (a smoke's generated assets), then every rank goes on."""
    if rt.is_main:
        with rt.console.status(message):
            make()
    engine.barrier(rt)


# ----------------------------------------------------------------------------- data sets
def check_splits(dataset, columns: tuple[str, ...], splits: tuple[str, ...], source: str):
    """``dataset`` (a DatasetDict) has ``splits``, each with ``columns``; else one line."""
    for split in splits:
        if split not in dataset:
            raise WorkloadError(f"{source}: no {split} split (has {', '.join(dataset) or 'none'})")
        missing = [c for c in columns if c not in dataset[split].column_names]
        if missing:
            raise WorkloadError(f"{source}: the {split} split has no {', '.join(missing)} "
                                f"column (expected {', '.join(columns)})")
    return dataset


def load_saved(path: Path, columns: tuple[str, ...], splits: tuple[str, ...]):
    """A data set saved with ``save_to_disk`` (seed 003's way), read with load_from_disk."""
    path = Path(path)
    hint = "a folder written by datasets' save_to_disk (DatasetDict)"
    if not path.is_dir():
        raise WorkloadError(f"data set {path}: no such folder; pass {hint}")
    if not (path / "dataset_dict.json").is_file():
        raise WorkloadError(f"data set {path}: no dataset_dict.json in it; pass {hint}")
    import datasets

    datasets.disable_progress_bars()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # arrow/json errors of a damaged copy
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WorkloadError(f"data set {path}: cannot load it ({type(exc).__name__}: "
                            f"{first})") from None
    return check_splits(loaded, columns, splits, f"data set {path}")


def cached_splits(name: str, columns: tuple[str, ...], splits: tuple[str, ...]):
    """(DatasetDict, where from) of the workload's data set as `dsenv fetch` prepared it."""
    from dsenv.workloads import assets

    asset = assets.asset_of(name, "dataset")
    source = f"{asset.repo} in {asset.saved_dir(assets.CacheLayout.from_env())}"
    dataset = assets.load_dataset(name)
    try:
        return check_splits(dataset, columns, splits, source), source
    except WorkloadError as exc:
        raise WorkloadError(f"{exc}; `dsenv fetch {name}` again") from None


def first_rows(split, count: int | None):
    """The first ``count`` rows of a split (all of them when ``count`` is None)."""
    return split.select(range(min(count, len(split)))) if count else split


def capped(data, args):
    """--max-train-samples / --max-eval-samples applied to a full run's splits."""
    data["train"] = first_rows(data["train"], args.max_train_samples)
    data["validation"] = first_rows(data["validation"], args.max_eval_samples)
    return data


def checked_user_data(args, columns, splits) -> Path | None:
    """The smoke's --data-dir, loaded once here so a bad folder fails before any engine."""
    if not args.data_dir:
        return None
    load_saved(Path(args.data_dir), columns, splits)
    return Path(args.data_dir)


# ----------------------------------------------------------------------------- the end
def conclude(args, name: str, mode: str, rt, s, planned, timings: dict, stats, metrics: dict,
             limits: dict[str, float], *, init_model: Path, data_info: dict,
             wall_start: float, model_dir: Path | None,
             show: Callable[[], object] | None = None, extra: dict | None = None) -> int:
    """Sanity (``limits``: :func:`thresholds`) and performance verdicts, the JSON report and
    the summary (rank 0), the same exit code on every rank: 0 PASS, 1 a verdict failed."""
    out_dir = Path(args.output_dir).resolve()
    sanity = report.sanity_verdict(stats.loss_curve, metrics, limits)
    perf = report.performance_verdict(stats.samples_per_s, rt.world_size, rt.device_type,
                                      planned.preset, s.perf_key,
                                      report.load_references(args.references))
    verdicts = [sanity, perf]
    status = report.overall(verdicts)
    if rt.is_main:
        if show is not None:
            show()
        first, last, drop = report.loss_drop(stats.loss_curve)
        report_path = Path(args.report) if args.report else out_dir / "report.json"
        doc = {
            "report_version": report.REPORT_VERSION, "workload": name, "mode": mode,
            "status": status, "versions": engine.versions(), "run": rt.describe(),
            "batch": planned.summary(), "ds_config": planned.config,
            "settings": dict(vars(s)), "seed": args.seed, "model": str(init_model),
            "data": data_info, "timings": timings,
            "training": {"steps": stats.steps, "warmup_steps": stats.warmup_steps,
                         "seconds": stats.seconds, "timed_seconds": stats.timed_seconds,
                         "samples_per_s": stats.samples_per_s,
                         "samples_per_s_per_device": stats.samples_per_s / rt.world_size,
                         "loss_first": first, "loss_last": last, "loss_drop": drop,
                         "loss_curve": stats.loss_curve},
            "metrics": metrics, **(extra or {}),
            "verdicts": [v.as_dict() for v in verdicts],
            "model_dir": str(model_dir) if model_dir else None,
            "report_path": str(report_path), "wall_s": time.perf_counter() - wall_start,
        }
        report.write_report(report_path, doc)
        report.print_summary(rt.console, doc)
    status = engine.broadcast(rt, status)
    engine.shutdown()
    return 0 if status == report.PASS else 1

