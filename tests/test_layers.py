"""The package's layout is its architecture: imports only go down the layers below, no
module imports itself back through a circle, and the tooling (the freeride command)
uses only what users can use. Read from the source with ast, nothing is imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "python" / "freeride"

# Bottom first. A module may import modules of its own layer (no circles) or of a layer
# below; a prefix names a package with everything in it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("bindings", ("freeride._C",)),
    (
        "basics",
        (
            "freeride.errors",
            "freeride._checks",
            "freeride._arrays",
            "freeride._device",
            "freeride._streams",
            "freeride._shutdown",
            "freeride._abandoned",
            "freeride.info",
            "freeride.simulate",
        ),
    ),
    ("per-device parts", ("freeride.gate", "freeride.handle", "freeride.reserve")),
    ("bubble record", ("freeride.record",)),
    ("iterative tasks", ("freeride.iterative",)),
    ("side tasks", ("freeride.tasks",)),
    ("schedule hooks", ("freeride.attach",)),
    (
        "harvester",
        (
            "freeride.harvester",
            "freeride._closing",
            "freeride._harvester_args",
            "freeride._harvester_counts",
            "freeride._harvester_mechanisms",
        ),
    ),
    ("engines and the job queue", ("freeride.integrations", "freeride.job")),
    ("public face", ("freeride", "freeride._moved")),
    ("tooling", ("freeride.cli", "freeride.__main__")),
]

# What the tooling may import of the package: the face and the public modules under it.
PUBLIC = ("freeride", "freeride.tasks", "freeride.simulate")


def _modules() -> dict[str, pathlib.Path]:
    found = {"freeride._C": PACKAGE / "_C"}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str:
    """The module `name` lives in (an imported attribute belongs to its module)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str, path: pathlib.Path) -> set[str]:
    """Every module of the package that `module` imports, at any depth of its code."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "freeride":
                owner = _owner(target)
                if owner != module:
                    out.add(owner)
    return out


GRAPH = {module: _imports(module, path) for module, path in MODULES.items() if path.suffix}


def _layer(module: str) -> int:
    best, depth = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = index, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is on no layer of tests/test_layers.py: place it")
    return best


def climbs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import from a module to one on a higher layer."""
    return sorted((m, t) for m, targets in graph.items() for t in targets if _layer(t) > _layer(m))


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_every_module_is_on_a_layer() -> None:
    for module in GRAPH:
        _layer(module)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_only_go_down(module: str) -> None:
    up = [t for m, t in climbs({module: GRAPH[module]})]
    assert not up, f"{module} ({LAYERS[_layer(module)][0]}) imports from higher layers: {up}"


def test_no_circles() -> None:
    found = circle(GRAPH)
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_tooling_uses_only_the_public_face() -> None:
    tooling = _layer("freeride.cli")
    private = {
        module: sorted(t for t in targets if _layer(t) < tooling and t not in PUBLIC)
        for module, targets in GRAPH.items()
        if _layer(module) == tooling
    }
    assert private, "no tooling module found"
    assert not {m: t for m, t in private.items() if t}


def test_the_checks_see_a_climb_and_a_circle() -> None:
    """Negative controls: the gate importing the harvester is a climb, and with the
    harvester's own import of the gate, a circle."""
    bad = {**GRAPH, "freeride.gate": GRAPH["freeride.gate"] | {"freeride.harvester"}}
    assert ("freeride.gate", "freeride.harvester") in climbs(bad)
    assert "freeride.gate" in GRAPH["freeride.harvester"]
    assert circle(bad) is not None
    assert climbs(GRAPH) == [] and circle(GRAPH) is None


def main() -> None:
    """Prints the import graph by layer, top first: ``python tests/test_layers.py``."""
    for index in reversed(range(len(LAYERS))):
        members = sorted(m for m in GRAPH if _layer(m) == index)
        print(f"{index:2} {LAYERS[index][0]}: {', '.join(members) or '(the extension)'}")
        for module in members:
            below = sorted(t for t in GRAPH[module] if _layer(t) != index)
            beside = sorted(t for t in GRAPH[module] if _layer(t) == index)
            if below or beside:
                print(f"     {module} -> {', '.join(below + beside)}")
    edges = sum(len(t) for t in GRAPH.values())
    found = circle(GRAPH)
    print(
        f"{len(GRAPH)} modules, {edges} imports, {len(climbs(GRAPH))} climb back up, "
        f"{'a circle: ' + ' -> '.join(found) if found else 'no circle'}"
    )


if __name__ == "__main__":
    main()
