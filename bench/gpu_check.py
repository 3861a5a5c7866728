"""Helpers of bench/gpu_check.sh: every step's figures go into one JSON file, written after
each piece (atomically), so a step that times out still leaves what it measured.

    python bench/gpu_check.py init     --json J --mode gpu|cpu-dry --budget S [--set K=V ...]
    python bench/gpu_check.py set      --json J K=V [K=V ...]          # values parsed as JSON
    python bench/gpu_check.py record   --json J --step NAME --rc RC --wall S --timeout S
                                       --log FILE [--report FILE --key K]
    python bench/gpu_check.py env      --json J
    python bench/gpu_check.py doctor   --json J --rounds 3 --save FILE
    python bench/gpu_check.py fullrun  --json J --work DIR --steps N --micro-batch N --rows N
                                       [--tiny] [--deadline EPOCH] [--save FILE]
    python bench/gpu_check.py summary  --json J

Only dsenv's command line and the project's test Hub (tests/harness/hubserver.py, found
wherever it sits under tests/) are used, so the check survives modules moving inside the
package. Keys are dotted paths ("smokes.fp16").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL_LINES = 25
VERSIONS_OF = ("torch", "deepspeed", "transformers", "datasets", "tokenizers", "huggingface-hub",
               "accelerate", "safetensors", "numpy", "pydantic", "pydantic-core", "hjson",
               "triton", "nvidia-nccl-cu13", "nvidia-ml-py", "mpi4py", "ninja", "dsenv",
               "httpx2", "click", "typer", "pyarrow", "rich", "psutil", "py-cpuinfo")


# ----------------------------------------------------------------------------- the JSON file
def load(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def save(path: str | Path, doc: dict) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def put(path: str | Path, key: str, value) -> None:
    """Set ``key`` (dotted) in the JSON file at ``path``, creating the dicts on the way."""
    doc = load(path)
    node = doc
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value
    save(path, doc)


BOX = "│╭╮╰╯─┏┓┗┛━┃┡┩╇┯┷┼├┤┬┴└┘┌┐═║ \t"


def tail(text: str, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` non-empty lines, rich's box characters stripped."""
    kept = [line.strip(BOX)[:300] for line in text.splitlines()]
    return [line for line in kept if line][-lines:]


def read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def run(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``cmd``; rc (124 on timeout, 127 when missing), wall time, stdout and stderr."""
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout),
                              env=env)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (
            exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (
            exc.stderr or "")
    except OSError as exc:
        rc, out, err = 127, "", str(exc)
    return {"rc": rc, "wall_s": round(time.perf_counter() - started, 3), "stdout": out,
            "stderr": err}


def hubserver():
    """The project's test Hub (tests/harness/hubserver.py, earlier tests/hubserver.py)."""
    import importlib
    import importlib.util

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    for name in ("tests.harness.hubserver", "tests.hubserver"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    for path in sorted(ROOT.glob("tests/**/hubserver.py")):
        spec = importlib.util.spec_from_file_location("hubserver", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["hubserver"] = module
        spec.loader.exec_module(module)
        return module
    raise ModuleNotFoundError("no tests/**/hubserver.py in " + str(ROOT))


def left(deadline: float | None, default: float) -> float:
    return default if not deadline else max(1.0, min(default, deadline - time.time() - 3))


# ----------------------------------------------------------------------------- run reports
VERDICT_LINE = re.compile(r"(PASS|FAIL|REPORTED)")


def verdict_lines(log_text: str) -> list[str]:
    """The summary panel's title and verdict rows, box characters stripped."""
    found = []
    for line in log_text.splitlines():
        clean = line.strip().strip("│╭╮╰╯─ ").strip()
        if VERDICT_LINE.search(clean) and (clean.startswith(("dsenv ", "sanity", "performance"))
                                           or "efficien" in clean):
            found.append(clean[:300])
    return found[-8:]


def find_keys(doc, needle: str, path: str = "") -> dict:
    """Every value whose key contains ``needle`` (e.g. 'efficien'), by dotted path."""
    hits = {}
    if isinstance(doc, dict):
        for key, value in doc.items():
            where = f"{path}.{key}" if path else str(key)
            if needle in str(key).lower():
                hits[where] = value
            hits.update(find_keys(value, needle, where))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            hits.update(find_keys(value, needle, f"{path}[{index}]"))
    return hits


def summarise_report(path: str | Path, keep_config: bool = False) -> dict:
    """A run report (report.json of `dsenv smoke`/`dsenv run`), read generically: every
    top-level field except the bulky ones, the loss curve shortened."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        return {"report_error": f"{type(exc).__name__}: {exc}"[:300]}
    out = {}
    for key, value in doc.items():
        if key in ("versions", "settings", "data", "model", "report_path") or (
                key == "ds_config" and not keep_config):
            continue
        if key == "training" and isinstance(value, dict):
            value = dict(value)
            curve = value.pop("loss_curve", None)
            if isinstance(curve, list):
                value["loss_curve_len"] = len(curve)
                value["loss_curve_head"] = [round(x, 4) for x in curve[:3]]
                value["loss_curve_tail"] = [round(x, 4) for x in curve[-3:]]
        out[key] = value
    for key in ("sanity", "performance"):  # verdict blocks by name, whatever the layout
        if key not in out:
            for verdict in doc.get("verdicts") or []:
                if isinstance(verdict, dict) and verdict.get("name") == key:
                    out[key] = verdict
    efficiency = find_keys(doc, "efficien")
    if efficiency:
        out["efficiency_found"] = efficiency
    training = doc.get("training") or {}
    out["samples_per_s"] = training.get("samples_per_s")
    return out


# ----------------------------------------------------------------------------- commands
def cmd_init(a) -> int:
    doc = {"schema": "dsenv.gpu_check/1", "mode": a.mode, "budget_s": a.budget,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": os.uname().nodename,
           "steps": {}}
    save(a.json, doc)
    for item in a.set or []:
        key, _, value = item.partition("=")
        put(a.json, key, _value(value))
    return 0


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def cmd_set(a) -> int:
    for item in a.items:
        key, _, value = item.partition("=")
        put(a.json, key, _value(value))
    return 0


def cmd_record(a) -> int:
    """A step's exit status, wall time and (when it failed) the end of its output; with
    --report, that run report summarised under --key."""
    text = read_text(a.log)
    status = ("ok" if a.rc == 0 else "timeout" if a.rc in (124, 137) else
              "skipped" if a.rc < 0 else "failed")
    entry = {"rc": a.rc, "status": status, "wall_s": a.wall, "timeout_s": a.timeout}
    if a.rc != 0 and text:
        entry["error_tail"] = tail(text)
    if a.note:
        entry["note"] = a.note
    put(a.json, f"steps.{a.step}", entry)
    if a.tail_key:
        put(a.json, a.tail_key, {"rc": a.rc, "wall_s": a.wall,
                                 "output_head": tail(text, 10**6)[:4],
                                 "output_tail": tail(text, 40)})
    if a.report:
        summary = {"rc": a.rc, "wall_s": a.wall, "verdict_lines": verdict_lines(text)}
        if Path(a.report).is_file():
            summary.update(summarise_report(a.report))
        else:
            summary["report_error"] = f"no report at {a.report}"
        put(a.json, a.key or f"results.{a.step}", summary)
    print(f"[gpu_check] {a.step}: {status} rc={a.rc} {a.wall:.1f}s", flush=True)
    return 0


def _versions() -> dict:
    from importlib import metadata

    found = {}
    for name in VERSIONS_OF:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def cmd_env(a) -> int:
    key = a.key
    put(a.json, f"{key}.python", sys.version.split()[0])
    put(a.json, f"{key}.python_executable", sys.executable)
    put(a.json, f"{key}.versions", _versions())
    for name, cmd in (("nvidia_smi_L", ["nvidia-smi", "-L"]),
                      ("nvidia_smi_query", ["nvidia-smi", "--query-gpu=name,memory.total,"
                                            "driver_version,clocks.max.sm,power.limit",
                                            "--format=csv,noheader"]),
                      ("nvcc", ["nvcc", "--version"]),
                      ("which", ["sh", "-c", "command -v python3 dsenv ds_report nvcc"])):
        r = run(cmd, 30)
        put(a.json, f"{key}.{name}", tail(r["stdout"] + r["stderr"], 8) if r["rc"] != 127
            else f"not found: {r['stderr'][:200]}")
    code = ("import json, torch; c = torch.cuda.is_available(); print(json.dumps({"
            "'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': c, "
            "'device': torch.cuda.get_device_name() if c else None, "
            "'capability': list(torch.cuda.get_device_capability()) if c else None, "
            "'arch_list': torch.cuda.get_arch_list() if c else None, "
            "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None, "
            "'cudnn': torch.backends.cudnn.version() if c else None}))")
    r = run([sys.executable, "-c", code], 120)
    try:
        put(a.json, f"{key}.torch", json.loads(r["stdout"].strip().splitlines()[-1]))
    except (ValueError, IndexError):
        put(a.json, f"{key}.torch", {"rc": r["rc"], "error_tail": tail(r["stderr"], 10)})
    git = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], 10)
    put(a.json, f"{key}.git_head", git["stdout"].strip() or None)
    env_keys = ("TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "CUDA_HOME", "DS_ACCELERATOR",
                "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG")
    put(a.json, f"{key}.environ", {k: os.environ.get(k) for k in env_keys})
    return 0


def cmd_doctor(a) -> int:
    """Cold doctor run with --json (saved), then rounds of `dsenv doctor` and `ds_report`
    alternated; the toolkit findings; the slowest checks (or the import time of the CLI)."""
    key = a.key
    cold = run(["dsenv", "doctor", "--json"], left(a.deadline, 120))
    put(a.json, f"{key}.json_run", {"rc": cold["rc"], "wall_s": cold["wall_s"],
                                    "stderr_tail": tail(cold["stderr"], 5)})
    try:
        report = json.loads(cold["stdout"])
    except ValueError:
        report = None
        put(a.json, f"{key}.json_error", tail(cold["stdout"] + cold["stderr"], 15))
    if report is not None:
        if a.save:
            Path(a.save).write_text(cold["stdout"])
        results = report.get("results") or []
        put(a.json, f"{key}.summary", report.get("summary"))
        put(a.json, f"{key}.verdict", report.get("verdict"))
        put(a.json, f"{key}.not_ok", [
            {k: r.get(k) for k in ("id", "status", "summary")}
            for r in results if r.get("status") in ("fail", "warn", "error")])
        put(a.json, f"{key}.toolkit_findings", [
            {k: r.get(k) for k in ("id", "status", "summary", "evidence", "fix")}
            for r in results if str(r.get("id", "")).startswith("toolkit.")])
        durations = []
        for r in results:
            for field in ("seconds", "duration_s", "elapsed_s", "duration"):
                if isinstance(r.get(field), (int, float)):
                    durations.append((r[field], r.get("id"), r.get("status")))
                    break
        if durations:
            durations.sort(reverse=True)
            put(a.json, f"{key}.slowest_checks", [
                {"id": i, "seconds": round(s, 4), "status": st} for s, i, st in durations[:10]])
            put(a.json, f"{key}.checks_seconds_sum", round(sum(d[0] for d in durations), 3))
    if report is None or not report.get("results") or "slowest_checks" not in load(a.json).get(
            key, {}):
        r = run([sys.executable, "-X", "importtime", "-c", "import dsenv.cli"], 60)
        rows = []
        for line in r["stderr"].splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[1].strip().isdigit():
                rows.append((int(parts[1]), parts[2].rstrip()))
        rows.sort(reverse=True)
        put(a.json, f"{key}.importtime_dsenv_cli", {
            "note": "the doctor's JSON carries no per-check durations",
            "total_us": rows[0][0] if rows else None,
            "top_cumulative_us": [{"us": us, "module": m.strip()} for us, m in rows[:12]]})
    rounds = []
    for index in range(a.rounds):
        doctor = run(["dsenv", "doctor"], left(a.deadline, 120))
        ds_report = run(["ds_report"], left(a.deadline, 120))
        rounds.append({"doctor_s": doctor["wall_s"], "doctor_rc": doctor["rc"],
                       "ds_report_s": ds_report["wall_s"], "ds_report_rc": ds_report["rc"]})
        put(a.json, f"{key}.rounds", rounds)
        if index == 0 and ds_report["rc"] != 0:
            put(a.json, f"{key}.ds_report_error", tail(ds_report["stderr"], 10))
    ratios = [r["doctor_s"] / r["ds_report_s"] for r in rounds if r["ds_report_s"] > 0]
    put(a.json, f"{key}.median_doctor_s", statistics.median(r["doctor_s"] for r in rounds))
    put(a.json, f"{key}.median_ds_report_s",
        statistics.median(r["ds_report_s"] for r in rounds))
    put(a.json, f"{key}.median_ratio_doctor_to_ds_report",
        round(statistics.median(ratios), 3) if ratios else None)
    print(f"[gpu_check] doctor vs ds_report rounds {rounds}", flush=True)
    return 0


# ----------------------------------------------------------------------------- the full run
def _build_repos(a, work: Path) -> dict:
    """bert-squad's two Hub repositories: a bert-base-shaped BertForQuestionAnswering
    (BertConfig() defaults, random weights; --tiny: 2 x 32) with a WordPiece vocabulary
    trained on the synthetic rows, and SQuAD-shaped parquet files."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

    hs = hubserver()
    train = hs.squad_rows(a.rows, 1, "train")
    validation = hs.squad_rows(a.eval_rows, 2, "validation")
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.train_from_iterator(
        [r["context"] for r in train] + [r["question"] for r in train],
        trainers.WordPieceTrainer(vocab_size=2000, show_progress=False,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    vocab = wordpiece.get_vocab()
    tokenizer = BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=512)
    torch.manual_seed(0)
    if a.tiny:
        config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64)
    else:
        config = BertConfig(vocab_size=30522)  # bert-base-uncased's shape: 12 x 768
    model_dir = work / "bert-base-uncased"
    model = BertForQuestionAnswering(config)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    del model
    tokenizer.save_pretrained(model_dir)
    (model_dir / "vocab.txt").write_text(
        "".join(f"{t}\n" for t in sorted(vocab, key=vocab.__getitem__)))
    files = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}
    files[".gitattributes"] = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    squad = {
        "plain_text/train-00000-of-00001.parquet": hs.squad_parquet(train),
        "plain_text/validation-00000-of-00001.parquet": hs.squad_parquet(validation),
        "README.md": b"---\nconfigs:\n- config_name: plain_text\n---\n# SQuAD (test copy)\n",
        ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n",
    }
    shape = {"hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
             "heads": config.num_attention_heads, "vocab_size": config.vocab_size,
             "parameters": parameters}
    return {"repos": {("model", hs.BERT_REPO): files, ("dataset", hs.SQUAD_REPO): squad},
            "shape": shape}


def cmd_fullrun(a) -> int:
    """`dsenv fetch bert-squad` from the test Hub on 127.0.0.1, then `dsenv run bert-squad`
    offline (HF_HUB_OFFLINE=1, the Hub still up and counting requests)."""
    hs = hubserver()
    key = a.key
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.perf_counter()
    built = _build_repos(a, work)
    put(a.json, f"{key}.build_s", round(time.perf_counter() - started, 1))
    put(a.json, f"{key}.model_shape", built["shape"])
    env = dict(os.environ, HF_HOME=str(work / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE",
                 "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    run_dir = work / "run"
    with hs.HubServer(built["repos"]) as hub:
        env["HF_ENDPOINT"] = hub.url
        fetch = run(["dsenv", "fetch", "bert-squad"], left(a.deadline, 300), env)
        put(a.json, f"{key}.fetch", {"rc": fetch["rc"], "wall_s": fetch["wall_s"],
                                     "hub_requests": len(hub.requests)})
        if fetch["rc"] != 0:
            put(a.json, f"{key}.fetch.error_tail", tail(fetch["stdout"] + fetch["stderr"]))
        hub.reset()
        offline = dict(env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                       TRANSFORMERS_OFFLINE="1")
        cmd = ["dsenv", "run", "bert-squad", "--preset", a.preset, "--epochs", "1",
               "--max-steps", str(a.steps), "--micro-batch", str(a.micro_batch),
               "--max-eval-samples", str(a.eval_rows), "--output-dir", str(run_dir),
               "--examples", "1"]
        put(a.json, f"{key}.command", " ".join(cmd))
        result = run(cmd, left(a.deadline, 900), offline)
        put(a.json, f"{key}.run", {"rc": result["rc"], "wall_s": result["wall_s"],
                                   "hub_requests_during_run": len(hub.requests),
                                   "verdict_lines": verdict_lines(result["stdout"])})
        print(result["stdout"][-4000:], result["stderr"][-4000:], sep="\n", flush=True)
        if result["rc"] != 0:
            put(a.json, f"{key}.run.error_tail", tail(result["stdout"] + result["stderr"]))
    report = run_dir / "report.json"
    if report.is_file():
        put(a.json, f"{key}.report", summarise_report(report, keep_config=True))
        if a.save:
            shutil.copyfile(report, a.save)
            page = report.with_name("report.html")  # the run's HTML page, GPU plots and all
            if page.is_file():
                shutil.copyfile(page, Path(a.save).with_suffix(".html"))
    return 0 if result["rc"] == 0 and fetch["rc"] == 0 else 1


def cmd_summary(a) -> int:
    """A few lines for the console: the figures that matter, from the JSON."""
    doc = load(a.json)
    lines = [f"mode {doc.get('mode')}, total {doc.get('total_wall_s')} s, arch "
             f"{json.dumps(doc.get('arch'))}"]
    doctor = doc.get("doctor") or {}
    lines.append(f"doctor {doctor.get('median_doctor_s')} s vs ds_report "
                 f"{doctor.get('median_ds_report_s')} s: ratio "
                 f"{doctor.get('median_ratio_doctor_to_ds_report')}")
    for name, smoke in (doc.get("smokes") or {}).items():
        lines.append(f"smoke {name}: rc {smoke.get('rc')} {smoke.get('status')} "
                     f"{_round(smoke.get('samples_per_s'))} samples/s, wall {smoke.get('wall_s')}")
    full = doc.get("fullrun") or {}
    report = full.get("report") or {}
    lines.append(f"full run: rc {(full.get('run') or {}).get('rc')} {report.get('status')} "
                 f"{_round(report.get('samples_per_s'))} samples/s")
    loops = doc.get("loops") or {}
    for name, row in (loops.get("results") or {}).items():
        lines.append(f"loop {name}: {row.get('samples_per_s')} samples/s, ratio to plain "
                     f"{row.get('ratio_to_plain_autocast')}, {row.get('optimizer')}"
                     + (f" ERROR {row.get('error')}" if row.get("error") else ""))
    plain = ((loops.get("results") or {}).get("plain_autocast") or {}).get("samples_per_s")
    if isinstance(plain, (int, float)) and isinstance(report.get("samples_per_s"), (int, float)):
        lines.append(f"full run vs plain loop: {report['samples_per_s'] / plain:.3f} "
                     f"({_round(report['samples_per_s'])} / {plain} samples/s)")
    for name, step in (doc.get("steps") or {}).items():
        if step.get("rc"):
            lines.append(f"step {name}: {step.get('status')} rc {step.get('rc')}")
    print("\n".join(f"[gpu_check] {line}" for line in lines), flush=True)
    return 0


def _round(value):
    return round(value, 1) if isinstance(value, (int, float)) else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check.py")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init")
    p.add_argument("--json", required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--budget", type=float, required=True)
    p.add_argument("--set", action="append")
    p = sub.add_parser("set")
    p.add_argument("--json", required=True)
    p.add_argument("items", nargs="+")
    p = sub.add_parser("record")
    p.add_argument("--json", required=True)
    p.add_argument("--step", required=True)
    p.add_argument("--rc", type=int, required=True)
    p.add_argument("--wall", type=float, required=True)
    p.add_argument("--timeout", type=float)
    p.add_argument("--log", default="")
    p.add_argument("--report")
    p.add_argument("--key")
    p.add_argument("--note")
    p.add_argument("--tail-key", help="keep the last 40 lines of the output under this key")
    for name in ("env", "doctor", "fullrun", "summary"):
        p = sub.add_parser(name)
        p.add_argument("--json", required=True)
        p.add_argument("--key", default=name)
        p.add_argument("--deadline", type=float)
        p.add_argument("--save")
    doctor = sub.choices["doctor"]
    doctor.add_argument("--rounds", type=int, default=3)
    full = sub.choices["fullrun"]
    full.add_argument("--work", required=True)
    full.add_argument("--steps", type=int, default=60)
    full.add_argument("--micro-batch", type=int, default=32)
    full.add_argument("--rows", type=int, default=5000)
    full.add_argument("--eval-rows", type=int, default=64)
    full.add_argument("--preset", default="bf16")
    full.add_argument("--tiny", action="store_true")
    a = parser.parse_args(argv)
    return {"init": cmd_init, "set": cmd_set, "record": cmd_record, "env": cmd_env,
            "doctor": cmd_doctor, "fullrun": cmd_fullrun, "summary": cmd_summary}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
