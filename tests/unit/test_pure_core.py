"""The pure core imports without starting llama.cpp (design: the DAG is testable with no
native code), and the native names still load on first use."""

from __future__ import annotations

from support.proc import python_cmd
from support.proc import run as run_child

PURE = [
    "swarmkv",
    "swarmkv.cli",
    "swarmkv.dag",
    "swarmkv.spec",
    "swarmkv.context_config",
    "swarmkv.budget",
    "swarmkv.modes",
    "swarmkv.sampling",
    "swarmkv.results",
    "swarmkv.errors",
    "swarmkv.nodes",
    "swarmkv.pipeline_toml",
    "swarmkv.models",
]


def run(code: str) -> str:
    proc = run_child(python_cmd("-c", code), cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_pure_modules_do_not_load_the_native_binding() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + "import swarmkv.cli as c; c.build_parser()\n"
        + "from swarmkv import ContextConfig; ContextConfig(n_ctx=64).effective_n_batch\n"
        + "print(sorted(m for m in sys.modules if m.startswith('swarmkv._native')))"
    )
    assert run(code) == "[]"


def test_toml_spec_loads_without_the_native_binding(tmp_path_factory: object) -> None:
    code = (
        "import sys, tempfile, pathlib\n"
        "from swarmkv.pipeline_toml import load_pipeline_spec\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        '(d / \'p.toml\').write_text(\'[document]\\nname = "doc"\\ntext = "Hello."\\n'
        '[[branch]]\\nname = "q"\\nprompt = " Why?"\\n\')\n'
        "spec = load_pipeline_spec(d / 'p.toml')\n"
        "print(len(spec.branches), 'swarmkv._native' in sys.modules)"
    )
    assert run(code) == "1 False"


def test_native_names_load_on_first_use() -> None:
    code = (
        "import sys, swarmkv\n"
        "assert 'swarmkv._native' not in sys.modules\n"
        "print(swarmkv.Model.__name__, len(swarmkv.LLAMA_CPP_COMMIT), "
        "'swarmkv._native' in sys.modules)"
    )
    assert run(code) == "Model 40 True"
