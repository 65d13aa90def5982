"""The source tree keeps its shape: layers import downwards only, the pipeline never imports
torch at module level, modules stay small and long functions say why they are long."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "zephon"

# Layer of each top-level part of the package; a module may import its own layer or lower.
LAYERS = {
    "refs": 0, "errors": 0, "arrays": 0, "executors": 0, "context": 0, "choices": 0,
    "permute": 0,
    "storage": 1, "formats": 1,
    "dataset": 2,
    "plan": 3, "engine": 3,
    "ops": 4,
    "pipeline": 5, "torch": 5,
    "cli": 6, "testing": 6, "__main__": 6,
}  # fmt: skip


def part(module: str) -> str:
    """``zephon.plan.lanes`` -> ``plan``."""
    return module.split(".")[1]


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if name != "zephon":
            out.append((name, path))
    return out


def module_level_imports(tree: ast.Module) -> list[str]:
    """Imports run when the module is imported (not those under ``if TYPE_CHECKING:``, not
    those inside functions)."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, ast.FunctionDef | ast.ClassDef) else ():
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                found.append(sub.module)
            elif isinstance(sub, ast.Import):
                found.extend(alias.name for alias in sub.names)
    return [m for m in found if m.startswith("zephon.")]


def test_layers_import_downwards_only() -> None:
    wrong = []
    for name, path in modules():
        mine = LAYERS[part(name)]
        for imported in module_level_imports(ast.parse(path.read_text())):
            theirs = LAYERS[part(imported)]
            if theirs > mine or (part(imported) == "torch" and part(name) != "torch"):
                wrong.append(f"{name} imports {imported}")
    assert wrong == []


def test_the_pipeline_package_does_not_import_torch_or_the_adapter() -> None:
    import subprocess
    import sys

    code = (
        "import sys, zephon, zephon.pipeline; "
        "print(sorted(m for m in sys.modules if m in ('torch', 'zephon.torch')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


MODULE_LINES = 420  # past this, a module likely holds two concerns
FUNCTION_STATEMENTS = 45  # statements, not lines: the formatter owns the lines


def test_long_modules_and_functions_say_why() -> None:
    """A module past :data:`MODULE_LINES` is split by concern (never packed to fit: the
    formatter owns the layout); a function past :data:`FUNCTION_STATEMENTS` statements says
    in its docstring why it is "Long because"."""
    too_long = []
    for name, path in modules():
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                statements = sum(isinstance(n, ast.stmt) for n in ast.walk(node)) - 1
                doc = ast.get_docstring(node) or ""
                if statements > FUNCTION_STATEMENTS and "Long because" not in doc:
                    too_long.append(f"{name}.{node.name}: {statements} statements")
    assert too_long == []


def test_the_formatter_owns_the_layout() -> None:
    """``ruff format`` leaves every file as it is, and the skip marker marks data tables only
    (a module-level literal)."""
    import subprocess
    import sys

    root = SRC.parents[1]
    paths = [str(root / p) for p in ("src", "tests", "benchmarks", "examples")]
    check = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", *paths], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    marker = "# fmt" + ": skip"  # not spelled whole here, or this line would count
    skips = []
    for folder in paths:
        for path in Path(folder).rglob("*.py"):
            text = path.read_text()
            if marker not in text:
                continue
            tables = {
                node.end_lineno
                for node in ast.parse(text).body
                if isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Dict | ast.DictComp | ast.Tuple | ast.List | ast.Set)
            }
            for number, line in enumerate(text.splitlines(), 1):
                if marker in line and number not in tables:
                    skips.append(f"{path.relative_to(root)}:{number}")
    assert skips == []


def test_every_package_docstring_maps_its_modules() -> None:
    """A reader opening a package finds every module in its docstring's table."""
    missing = []
    for init in sorted(SRC.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for module in sorted(init.parent.glob("*.py")):
            if module.name != "__init__.py" and f"``{module.stem}``" not in doc:
                missing.append(f"{init.parent.name}/{module.name}")
    assert sorted(p.parent.name for p in SRC.glob("*/__init__.py")) == sorted(
        p.name for p in SRC.iterdir() if p.is_dir() and any(p.glob("*.py"))
    ), "a package without an __init__.py (and so without a docstring)"
    assert missing == []
