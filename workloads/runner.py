"""The skeleton every bundled workload runs through, once. A workload is a module
(workloads/bert_squad.py, ...) that keeps only its data, model, batches and evaluation, and
defines by name what the skeleton calls: the typed contract in workloads/contract.py
(``Workload``: NAME, SMOKE, FULL, THRESHOLDS, OPTIONS, ASSETS, write_synthetic,
train_tokenizer, tiny_model, samples, train_and_evaluate, run; and where it needs them the
optional hooks: COLUMNS and SPLITS or read_data, prepare and preparing, PACKAGES, check,
settled). Its ``run(args, mode)`` is ``runner.run(this module, args, mode)``.

A smoke (:func:`run_smoke`): options checked, ranks and config, rank 0 makes the synthetic
data, tokenizer and tiny model, every rank reads them back the way real ones are read. A
full run (:func:`run_full`): offline, options and assets checked before any engine starts,
the data read (and tokenized), the steps planned over it. Both then hand a :class:`Run` to
the workload's ``train_and_evaluate``.

torch, transformers and datasets are imported inside the functions: the doctor and the
command line read the workloads' settings without them.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from dsenv import targetlock
from dsenv.staging import staged_dir
from dsenv.workloads import efficiency, pages, report
from dsenv.workloads.contract import Workload
from dsenv.workloads.errors import WorkloadError
from dsenv.workloads.fetch import assets
from dsenv.workloads.launch import target
from dsenv.workloads.training import dsconfig, engine, runtime


# ----------------------------------------------------------------------------- a workload
@dataclass(frozen=True)
class Settings:
    """What the skeleton reads from every workload's settings; each workload's Settings adds
    its lengths, model size and metric thresholds, and its FULL and SMOKE set these."""

    micro_batch: int = 32
    steps: int = 0  # optimizer steps; 0: epochs over the data set
    epochs: int = 1
    warmup_steps: int = 0  # linear warm-up, then linear decay; excluded from throughput
    warmup_fraction: float = 0.1  # of the steps, when warmup_steps is 0
    lr: float = 5e-5
    eval_batch: int = 64
    min_loss_drop: float = 0.5  # sanity: the loss falls by at least this fraction
    perf_key: str = ""  # the run's entry in references.toml


@dataclass(frozen=True)
class Run:
    """One smoke or full run, as the skeleton hands it to ``train_and_evaluate``."""

    workload: Workload
    args: argparse.Namespace
    mode: str  # "smoke" or "run"
    rt: runtime.Runtime
    s: Settings  # the workload's, steps and warm-up fixed
    planned: dsconfig.PlannedConfig
    timings: dict
    init_model: Path
    wall_start: float

    @property
    def out_dir(self) -> Path:
        return Path(self.args.output_dir).resolve()


def run(workload: Workload, args, mode: str = "smoke") -> int:
    return run_smoke(workload, args) if mode == "smoke" else run_full(workload, args)


def run_smoke(w: Workload, args) -> int:
    """Synthetic data, tokenizer and tiny model made here; everything else as a full run."""
    wall_start = time.perf_counter()
    s = smoke_settings(args, w.SMOKE)
    out_dir = Path(args.output_dir).resolve()
    check_options(w, args)
    user_data = Path(args.data_dir) if args.data_dir else None
    if user_data is not None:  # a bad folder fails before any engine starts
        read(w, args, "smoke", None)
    rt = runtime.start()
    quiet_transformers()
    planned = plan(args, rt, s)
    timings = launch(args, rt, w.NAME, "smoke", planned)
    with claimed(rt, out_dir, f"dsenv smoke {w.NAME}"):
        return _smoke(w, args, rt, s, planned, timings, out_dir, user_data, wall_start)


def _smoke(w: Workload, args, rt, s: Settings, planned, timings: dict, out_dir: Path,
           user_data: Path | None, wall_start: float) -> int:
    # assets: rank 0 writes them, everyone reads them back the way real ones are read
    smoke_assets = out_dir / "assets"
    on_main(rt, w.ASSETS,
            lambda: make_smoke_assets(w, smoke_assets, s, args.seed, user_data))
    init_model = smoke_assets / "init-model"
    data = read(w, args, "smoke", smoke_assets / "data")
    if hasattr(w, "prepare"):
        data = w.prepare(data, init_model, s, args)
    return w.train_and_evaluate(Run(w, args, "smoke", rt, s, planned, timings, init_model,
                                    wall_start), data)


def run_full(w: Workload, args) -> int:
    """The real model and data from the offline cache (or --data-dir), never the network."""
    wall_start = time.perf_counter()
    assets.force_offline()
    s = replace(w.FULL, **{name: getattr(args, option) for option, name in w.OPTIONS.items()
                           if getattr(args, option, None)})
    s = w.settled(s) if hasattr(w, "settled") else s
    check_options(w, args)
    # every input is checked before an engine starts: a missing asset is one line, at once
    init_model = assets.model_path(w.NAME)
    data = read(w, args, "run", None)

    rt = runtime.start()
    quiet_transformers()
    if hasattr(w, "prepare"):
        with rt.console.status(w.preparing(data, s)) if hasattr(w, "preparing") \
                else nullcontext():
            data = w.prepare(data, init_model, s, args)
    planned = plan(args, rt, s, scheduled=False)
    count, what, unit = w.samples(data, s)
    steps, warmup = planned_steps(s, count, planned.batch.micro_batch, planned.batch.grad_accum,
                                  rt.world_size, args.max_steps, what,
                                  per_rank_data=bool(getattr(args, "no_sync_gradients", False)))
    s = replace(s, steps=steps, warmup_steps=warmup)
    planned = dsconfig.with_schedule(planned, warmup, steps)
    timings = launch(args, rt, w.NAME, "run", planned, f"{steps} steps ({s.epochs} epochs"
                     f"{', capped by --max-steps' if args.max_steps else ''}) over {count} "
                     f"{unit}")
    with claimed(rt, Path(args.output_dir).resolve(), f"dsenv run {w.NAME}"):
        return w.train_and_evaluate(Run(w, args, "run", rt, s, planned, timings, init_model,
                                        wall_start), data)


# ----------------------------------------------------------------------------- assets
def make_smoke_assets(w: Workload, root: Path, s: Settings, seed: int,
                      user_data: Path | None) -> None:
    """Rank 0: the synthetic data set (unless ``user_data``), a tokenizer trained on its
    training split, and the initial tiny model, all saved to disk below ``root``."""
    data_dir = user_data or root / "data"
    if user_data is None:
        w.write_synthetic(data_dir, s, seed)
    tokenizer = w.train_tokenizer(data_dir, s)
    import torch  # torch: only once a run starts

    torch.manual_seed(seed)
    model = w.tiny_model(s, tokenizer)
    with staged_dir(root / "init-model") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)



# ----------------------------------------------------------------------------- options
def check_options(w: Workload, args) -> None:
    """Every option this workload cannot take, a missing package, an unknown preset or a bad
    ds_config: one line, before anything starts (0.1 s, no torch)."""
    reject_options(args, w.NAME)
    require(w.NAME, getattr(w, "PACKAGES", {}))
    dsconfig.check_inputs(args.preset, args.deepspeed_config)
    if hasattr(w, "check"):
        w.check(args)


# The options of `dsenv smoke|run` that one workload owns: argparse dest -> (workload, flag)
OWNED_OPTIONS = {"no_sync_gradients": ("bert-mrpc", "--no-sync-gradients"),
                 "doc_stride": ("bert-squad", "--doc-stride"),
                 "model_dir": ("bert-squad", "--model-dir")}


def reject_options(args, name: str) -> None:
    """One line for another workload's command-line option, before anything starts."""
    for dest, (owner, flag) in OWNED_OPTIONS.items():
        if owner != name and getattr(args, dest, None):
            raise WorkloadError(f"{flag} is not an option of {name}")


def require(name: str, packages: dict[str, str]) -> None:
    """One line naming what to install when a package this workload imports is missing
    (``packages``: module -> distribution), before anything starts."""
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
    import transformers  # transformers: only once a run starts

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


def launch(args, rt, name: str, mode: str, planned, extra: str = "") -> dict:
    """The run's first line, then torch.distributed (JIT builds announced). Timings."""
    rt.log(f"[bold]dsenv {mode} {name}[/]: {rt.ranks.launcher}, world size {rt.world_size}, "
           f"{rt.backend} on {rt.device_type}; preset {planned.preset}; global batch "
           f"{planned.batch.describe()}" + (f"; {extra}" if extra else ""))
    return engine.init_distributed(rt, planned.config, verbose=args.verbose)


@contextmanager
def claimed(rt, out_dir: Path, command: str) -> Iterator[None]:
    """One run at a time per output folder: rank 0 locks it for the whole run (a second run
    with the same --output-dir would interleave reports and models), and every rank learns
    whether it may go on, so a refused run ends on all ranks with the same one line."""
    lock = targetlock.TargetLock(out_dir, command, advice="wait for it to finish, or pass "
                                 "another --output-dir")
    refusal = ""
    if rt.is_main:
        try:
            lock.acquire(wait=0)
        except targetlock.TargetBusy as exc:
            refusal = str(exc)
    refusal = runtime.broadcast(rt, refusal)
    if refusal:
        raise targetlock.TargetBusy(refusal)
    try:
        yield
    finally:
        lock.release()


def on_main(rt, message: str, make: Callable[[], object]) -> None:
    """``make()`` on rank 0 (a smoke's generated assets), then every rank goes on."""
    if rt.is_main:
        with rt.console.status(message):
            make()
    runtime.barrier(rt)


def train(run: Run, ds, tensors: dict, independent: bool = False) -> engine.TrainStats:
    """The run's steps through the engine over seeded micro-batches of ``tensors``;
    ``independent``: every rank its own seed and its own order of all of them (ranks that
    train without gradient sync, each its own model)."""
    import torch  # torch: only once a run starts

    rt, seed = run.rt, run.args.seed
    torch.manual_seed(seed + (rt.rank if independent else 0))
    batches = engine.micro_batches(tensors, run.planned.batch.micro_batch, rt, seed,
                                   independent=independent)
    return engine.train(ds, rt, batches, run.s.steps, run.s.warmup_steps, label="training",
                        clip_norm=run.planned.outside_clipping)


# ----------------------------------------------------------------------------- data sets
class SavedData(NamedTuple):
    """A data set saved with save_to_disk, and where it came from (for the report)."""

    splits: object  # datasets.DatasetDict
    source: str


def read(w: Workload, args, mode: str, generated: Path | None):
    """The data: the workload's own reader, else its save_to_disk data set."""
    own = getattr(w, "read_data", None)
    return own(args, mode, generated) if own else read_saved(w, args, mode, generated)


def read_saved(w: Workload, args, mode: str, generated: Path | None) -> SavedData:
    """--data-dir, the smoke's generated folder, or the data set `dsenv fetch` prepared; a
    full run's first --max-train-samples / --max-eval-samples rows."""
    if args.data_dir:
        data = SavedData(load_saved(Path(args.data_dir), w.COLUMNS, w.SPLITS), str(args.data_dir))
    elif mode == "smoke":
        data = SavedData(load_saved(generated, w.COLUMNS, w.SPLITS), str(generated))
    else:
        data = SavedData(*cached_splits(w.NAME, w.COLUMNS, w.SPLITS))
    return SavedData(capped(data.splits, args), data.source) if mode == "run" else data


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
    """A data set saved with ``save_to_disk``, read with load_from_disk (the way a job on a
    node without internet reads a data set prepared elsewhere)."""
    path = Path(path)
    hint = "a folder written by datasets' save_to_disk (DatasetDict)"
    if not path.is_dir():
        raise WorkloadError(f"data set {path}: no such folder; pass {hint}")
    if not (path / "dataset_dict.json").is_file():
        raise WorkloadError(f"data set {path}: no dataset_dict.json in it; pass {hint}")
    import datasets  # datasets: only once a run starts

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


# ----------------------------------------------------------------------------- the end
def conclude(run: Run, stats, metrics: dict, *, data_info: dict, model_dir: Path | None,
             show: Callable[[], object] | None = None, extra: dict | None = None) -> int:
    """Sanity (the workload's thresholds) and performance verdicts, the JSON report and the
    summary (rank 0), the same exit code on every rank: 0 PASS, 1 a verdict failed."""
    args, rt, s, planned = run.args, run.rt, run.s, run.planned
    sanity = report.sanity_verdict(stats.loss_curve, metrics,
                                   thresholds(s, run.workload.THRESHOLDS))
    perf = report.performance_verdict(stats.samples_per_s, rt.world_size, rt.device_type,
                                      planned.preset, s.perf_key,
                                      report.load_references(args.references),
                                      stats.contention)
    verdicts = [sanity, perf]
    status = report.overall(verdicts)
    if rt.is_main:
        if show is not None:
            show()
        first, last, drop = report.loss_drop(stats.loss_curve)
        report_path = Path(args.report) if args.report else run.out_dir / "report.json"
        doc = {
            "report_version": report.REPORT_VERSION, "workload": run.workload.NAME,
            "mode": run.mode, "status": status, "environment": target.current(),
            "versions": runtime.versions(),
            "run": rt.describe(), "batch": planned.summary(), "ds_config": planned.config,
            "settings": dict(vars(s)), "seed": args.seed, "model": str(run.init_model),
            "data": data_info, "timings": run.timings,
            "training": {"steps": stats.steps, "warmup_steps": stats.warmup_steps,
                         "seconds": stats.seconds, "timed_seconds": stats.timed_seconds,
                         "samples_per_s": stats.samples_per_s,
                         "samples_per_s_per_device": stats.samples_per_s / rt.world_size,
                         "efficiency": efficiency.for_run(
                             run.init_model, s, planned.config, rt.device_type,
                             stats.samples_per_s / rt.world_size,
                             tf32=rt.on_gpu and efficiency.torch_allows_tf32()),
                         "split_ms": stats.split,
                         "contention": (stats.contention.to_json()
                                        if stats.contention else None),
                         "loss_first": first, "loss_last": last, "loss_drop": drop,
                         "loss_curve": stats.loss_curve,
                         "step_seconds": stats.step_seconds},
            "metrics": metrics, **(extra or {}),
            "verdicts": [v.as_dict() for v in verdicts],
            "model_dir": str(model_dir) if model_dir else None,
            "report_path": str(report_path), "wall_s": time.perf_counter() - run.wall_start,
        }
        page = pages.html_path(args, report_path)
        doc["html_path"] = str(page) if page else None
        report.write_report(report_path, doc)
        if page is not None:
            try:
                pages.write_run_page(doc, page)
            except OSError as exc:  # the run and its JSON report stand without the page
                doc["html_path"] = None
                rt.log(f"[yellow]dsenv: HTML report not written: {page}: "
                       f"{exc.strerror or exc}[/]")
        report.print_summary(rt.console, doc)
    status = runtime.broadcast(rt, status)
    runtime.shutdown()
    return report.exit_code(status)
