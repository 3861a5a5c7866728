"""Whether DeepSpeed's async_io op (NVMe offload) can link libaio on this node, judged by the
test DeepSpeed itself runs before it builds the op (op_builder/builder.py ``has_function(
'io_submit', ('aio',))``: a program that calls io_submit, compiled and linked with ``-laio``
under CFLAGS and LDFLAGS), without importing torch or DeepSpeed: a C compile, well under a
second."""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsenv.facts.host import tempdir
from dsenv.facts.node import Node, probe

# DeepSpeed's own test program (builder.py has_function)
PROGRAM = "void io_submit(void); int main(int argc, char** argv) { io_submit(); return 0; }\n"


@dataclass(frozen=True)
class AioLink:
    compiler: str | None  # the C compiler tried (CC, else cc/gcc on PATH); None: none found
    linked: bool | None  # None: not tried (no compiler, or it did not answer)
    detail: str = ""  # the compiler's last line when the link failed, or why it was not tried


def _flags(node: Node, name: str) -> list[str]:
    try:
        return shlex.split(node.env.get(name, ""))
    except ValueError:  # an unbalanced quote: the compiler would get the words as they are
        return node.env.get(name, "").split()


@probe
def aio_link(node: Node) -> AioLink:
    cc = node.env.get("CC", "").split()
    compiler = (node.which(cc[0]) if cc else None) or node.which("cc") or node.which("gcc")
    if compiler is None:
        return AioLink(None, None, "no C compiler on PATH (CC, cc, gcc)")
    scratch = tempdir.temp_folder(node)
    if scratch is not None and scratch.hung:  # the compiler's files (and ours) would hang there
        return AioLink(compiler, None, f"not tried: the temporary folder {scratch.path} gave "
                       "no answer")
    with tempfile.TemporaryDirectory(prefix="dsenv-aio-") as tmp:
        source = Path(tmp) / "aio.c"
        source.write_text(PROGRAM)
        run = node.run([compiler, *cc[1:], *_flags(node, "CFLAGS"), str(source), "-o",
                        str(Path(tmp) / "aio"), *_flags(node, "LDFLAGS"), "-laio"], timeout=30)
    if run.ok:
        return AioLink(compiler, True)
    lines = [line.strip() for line in (run.stderr or run.stdout or "").splitlines() if line.strip()]
    if run.returncode is None or not lines:  # timed out, or the compiler could not start
        return AioLink(compiler, None, run.describe())
    return AioLink(compiler, False, next((x for x in lines if "aio" in x), lines[-1]))
