"""Read untrusted YAML safely: bounded size, bounded alias expansion, no duplicate keys.

``yaml.safe_load`` runs no code, but it still accepts documents that cost far more than their size:

- an alias bomb ("billion laughs"): ten lines of anchors, each aliasing the previous one ten times,
  describe 10^9 nodes. PyYAML shares the aliased objects, so loading is fast, but anything that walks
  or copies the result (the key -> line map, pydantic, ``model_dump``) expands it and hangs or runs out
  of memory;
- a recursive alias (``a: &x [*x]``) makes a cyclic structure that such walks never leave;
- deep nesting overflows PyYAML's recursive composer (a ``RecursionError``);
- a key given twice in one mapping silently keeps the last value.

:func:`load_yaml` composes the node graph (linear in the text), checks it without expanding it
(:func:`expanded_size` is memoised per node), and only then constructs Python data. Every refusal is a
:class:`ConfigError` of one line naming the file (and line where there is one).
"""

from __future__ import annotations

from typing import Any

import yaml

from tandem.errors import ConfigError

MAX_BYTES = 4 * 2**20  # a config is a few KB; the cap only stops runaway inputs
MAX_NODES = 100_000  # YAML nodes after alias expansion; real configs have a few hundred
MAX_DEPTH = 64  # nesting levels, checked before PyYAML's recursive composer can overflow the stack
MERGE_KEY = "<<"


def load_yaml(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """``(data, key -> line)`` of one YAML document after the checks above.

    ``key -> line`` maps dotted keys of nested mappings to 1-based line numbers (for error messages).
    """
    if len(text) > MAX_BYTES:
        raise ConfigError(f"YAML text is {len(text)} characters, over the {MAX_BYTES} limit", where=source)
    _check_depth(text, source)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, {}
        if expanded_size(root, source) > MAX_NODES:
            raise ConfigError(
                f"YAML aliases expand to more than {MAX_NODES} nodes (an alias bomb?)",
                where=source,
                hint="write the values out instead of nesting aliases",
            )
        _check_duplicate_keys(root, source)
        return loader.construct_document(root), _key_lines(root)
    finally:
        loader.dispose()


def _check_depth(text: str, source: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH`, from the parser's events (iterative, so a document
    nested 100k deep costs no stack)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1
                    raise ConfigError(f"YAML nested deeper than {MAX_DEPTH} levels", where=f"{source}:{line}")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return  # the full load below reports the syntax error with its line


def expanded_size(root: yaml.Node, source: str) -> int:
    """Number of nodes ``root`` stands for once every alias is expanded, without expanding it: each
    distinct node's size is computed once (post-order, iterative). A node that contains itself through
    an alias is a :class:`ConfigError` naming its line."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            active.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in _children(node)), MAX_NODES + 1)
            continue
        if key in sizes:
            continue
        if key in active:
            raise ConfigError("recursive YAML alias", where=f"{source}:{node.start_mark.line + 1}")
        active.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in active:
                raise ConfigError("recursive YAML alias", where=f"{source}:{child.start_mark.line + 1}")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_duplicate_keys(root: yaml.Node, source: str) -> None:
    """A scalar key given twice in one mapping is an error at the second one's line (merge keys
    ``<<`` excepted: keys beside a merge override the merged ones, as YAML intends)."""
    seen_nodes: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.value == MERGE_KEY:
                    continue
                line = key.start_mark.line + 1
                if key.value in first:
                    raise ConfigError(
                        f"duplicate key '{key.value}' (first set on line {first[key.value]})",
                        where=f"{source}:{line}",
                        hint="keep one of them",
                    )
                first[key.value] = line
        stack.extend(_children(node))


def _key_lines(root: yaml.Node) -> dict[str, int]:
    """Dotted keys of nested mappings -> 1-based line of the key (bounded: the graph was checked)."""
    out: dict[str, int] = {}
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    dotted = f"{prefix}{key.value}"
                    out.setdefault(dotted, key.start_mark.line + 1)
                    stack.append((value, dotted + "."))
    return out
