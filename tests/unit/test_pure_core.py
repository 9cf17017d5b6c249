"""The native names of the package root load the binding on first use, not on import (the
layers and the pure modules are checked statically: tests/unit/test_layers.py)."""

from __future__ import annotations

from support.proc import python_cmd
from support.proc import run as run_child


def run(code: str) -> str:
    proc = run_child(python_cmd("-c", code), cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_toml_spec_loads_without_the_native_binding(tmp_path_factory: object) -> None:
    code = (
        "import sys, tempfile, pathlib\n"
        "from swarmkv.pipeline.toml import load_pipeline_spec\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        '(d / \'p.toml\').write_text(\'[document]\\nname = "doc"\\ntext = "Hello."\\n'
        '[[branch]]\\nname = "q"\\nprompt = " Why?"\\n\')\n'
        "spec = load_pipeline_spec(d / 'p.toml')\n"
        "import swarmkv.cli as c; c.build_parser()\n"
        "print(len(spec.branches), 'swarmkv._native' in sys.modules)"
    )
    assert run(code) == "1 False"


def test_native_names_load_on_first_use() -> None:
    code = (
        "import sys, swarmkv\n"
        "assert 'swarmkv._native' not in sys.modules\n"
        "from swarmkv import Pipeline, Swarm\n"
        "print(swarmkv.Model.__name__, len(swarmkv.LLAMA_CPP_COMMIT), Pipeline.__name__, "
        "Swarm.__name__, 'swarmkv._native' in sys.modules)"
    )
    assert run(code) == "Model 40 Pipeline Swarm True"
