"""Turn a YAML document into frozen dataclasses, with errors that name file, line and key path.

The schema is the dataclasses themselves (core/config.py): field types, defaults and a `doc`
string in each field's metadata. Validation walks PyYAML's node tree rather than the loaded
Python objects because only nodes remember the line they came from.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import operator
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Union, get_args, get_origin, get_type_hints

import yaml


class ConfigError(Exception):
    """A config problem, already formatted as `file:line: key.path: what was wrong`."""

    def __init__(self, source: str, line: int, path: str, message: str) -> None:
        self.source, self.line, self.path, self.message = source, line, path, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {path}: {message}" if path else f"{where}: {message}")


# ---- constraints, attached with typing.Annotated --------------------------------------------


@dataclass(frozen=True)
class _Bound:
    """Number compared with `bound` by the subclass's `op`; `what` names the unit in messages ("seconds")."""

    bound: float
    what: str = "a number"
    symbol: ClassVar[str]
    op: ClassVar[Callable[[Any, Any], bool]]

    def describe(self) -> str:
        return f"{self.what} {self.symbol} {self.bound:g}"

    def check(self, v: Any) -> str | None:
        return None if type(self).op(v, self.bound) else f"expected {self.describe()}"


class Gt(_Bound):
    """Number strictly greater than `bound`."""

    symbol = ">"
    op = operator.gt


class Ge(_Bound):
    symbol = ">="
    op = operator.ge


class Le(_Bound):
    symbol = "<="
    op = operator.le


@dataclass(frozen=True)
class NonEmpty:
    def check(self, v: Any) -> str | None:
        return None if v else "expected a non-empty value"


@dataclass(frozen=True)
class AbsPath:
    def check(self, v: Any) -> str | None:
        return None if str(v).startswith("/") else "expected an absolute path"


Seconds = Annotated[float, Gt(0, "seconds")]
Port = Annotated[int, Ge(0, "a port"), Le(65535, "a port")]
Percent = Annotated[float, Ge(0, "a percentage"), Le(100, "a percentage")]


def doc(text: str, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its documentation (printed by `podhealth config default`)."""
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={"doc": text})
    return dataclasses.field(default=default, metadata={"doc": text})


# ---- loading -------------------------------------------------------------------------------

_SCALAR = yaml.constructor.SafeConstructor()


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Annotated:
        return _type_name(get_args(tp)[0])
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        return "a list"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            Path: "a path", type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _show(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return f'"{node.value}"' if node.style is None and node.tag.endswith(":str") else repr(node.value) if node.style else str(node.value)
    return "a mapping" if isinstance(node, yaml.MappingNode) else "a list"


class _Loader:
    """`errors` given: collect every problem (a bad key's default stands in for it, and a mapping
    with a bad key skips its validate()); else raise the first."""

    def __init__(self, source: str, errors: list[ConfigError] | None = None) -> None:
        self.source = source
        self.errors = errors

    def report(self, e: ConfigError) -> None:
        if self.errors is None:
            raise e
        self.errors.append(e)

    def err(self, node: yaml.Node | None, path: str, msg: str) -> ConfigError:
        line = node.start_mark.line + 1 if node is not None else 0
        return ConfigError(self.source, line, path, msg)

    def construct(self, node: yaml.Node, path: str, whole: bool = False) -> Any:
        """The node's Python value. An explicit tag can fail here, after composing succeeded:
        `!!int abc` raises ValueError, `!custom x` a ConstructorError."""
        try:
            return _SCALAR.construct_document(node) if whole else _SCALAR.construct_object(node)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:
            problem = getattr(e, "problem", None) or str(e)
            raise self.err(node, path, f"cannot read {_show(node)}: {problem}") from None

    def convert(self, tp: Any, node: yaml.Node, path: str) -> Any:
        origin = get_origin(tp)
        if origin is Annotated:
            base, *constraints = get_args(tp)
            try:
                value = self.convert(base, node, path)
            except ConfigError:
                # Say what is wanted in the field's own terms ("seconds > 0"), not just "a number".
                wanted = " and ".join(c.describe() for c in constraints if hasattr(c, "describe"))
                if not wanted:
                    raise
                raise self.err(node, path, f"expected {wanted}, got {_show(node)}") from None
            for c in constraints:
                problem = c.check(value) if hasattr(c, "check") else None
                if problem:
                    raise self.err(node, path, f"{problem}, got {_show(node)}")
            return value
        if tp is Any:
            return self.construct(node, path, whole=not isinstance(node, yaml.ScalarNode))
        if origin in (Union, types.UnionType):
            args = get_args(tp)
            if type(None) in args and isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
                return None
            alts = [a for a in args if a is not type(None)]
            if len(alts) == 1:  # `X | None` given a wrong X: say what X wanted ("an absolute path")
                return self.convert(alts[0], node, path)
            errors = []
            for a in args:
                if a is type(None):
                    continue
                try:
                    return self.convert(a, node, path)
                except ConfigError as e:
                    errors.append(e)
            raise self.err(node, path, f"expected {_type_name(tp)}, got {_show(node)}")
        if origin is Literal:
            value = self.construct(node, path) if isinstance(node, yaml.ScalarNode) else None
            if value not in get_args(tp):
                raise self.err(node, path, f"expected {_type_name(tp)}, got {_show(node)}")
            return value
        if origin in (tuple, list):
            if not isinstance(node, yaml.SequenceNode):
                raise self.err(node, path, f"expected a list, got {_show(node)}")
            item_tp = get_args(tp)[0]
            return tuple(self.convert(item_tp, n, f"{path}[{i}]") for i, n in enumerate(node.value))
        if origin in (dict, typing.Mapping, collections.abc.Mapping):
            if not isinstance(node, yaml.MappingNode):
                raise self.err(node, path, f"expected a mapping, got {_show(node)}")
            ktp, vtp = get_args(tp)
            out = {}
            for kn, vn in node.value:
                key = self.convert(ktp, kn, path)
                if key in out:  # YAML would keep the last silently: a site's two rules for one code
                    raise self.err(kn, f"{path}.{key}" if path else str(key), "duplicate key")
                try:
                    out[key] = self.convert(vtp, vn, f"{path}.{key}" if path else str(key))
                except ConfigError as e:
                    if self.errors is None:
                        raise
                    self.report(e)  # one bad entry (a site check, a code) must not hide the next one's errors
            return types.MappingProxyType(out)
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, node, path)
        if not isinstance(node, yaml.ScalarNode):
            raise self.err(node, path, f"expected {_type_name(tp)}, got {_show(node)}")
        value = self.construct(node, path)
        if tp is bool:
            if isinstance(value, bool):
                return value
        elif tp is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif tp is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                try:
                    return float(value)
                except OverflowError:  # an integer beyond any float (a typo of many digits)
                    raise self.err(node, path, f"expected {_type_name(tp)}, got a number out of range") from None
        elif tp is str:
            if isinstance(value, (str, int, float)) and not isinstance(value, bool):
                return str(value) if not isinstance(value, str) else value
        elif tp is Path:
            if isinstance(value, str) and value:
                return Path(value)
        raise self.err(node, path, f"expected {_type_name(tp)}, got {_show(node)}")

    def dataclass(self, cls: Any, node: yaml.Node, path: str, base: Any = None) -> Any:
        """`cls` from a mapping; the keys it leaves out keep `base`'s values (the parent field's
        own default, as `config default` prints it: aggregator.listen is 127.0.0.1:9420, the
        agent's listen 0.0.0.0:9410), else the class defaults."""
        def make(**kw: Any) -> Any:
            return dataclasses.replace(base, **kw) if base is not None else cls(**kw)

        if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
            return make()
        if not isinstance(node, yaml.MappingNode):
            raise self.err(node, path, f"expected a mapping, got {_show(node)}")
        hints = get_type_hints(cls, include_extras=True)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        seen: set[str] = set()
        before = len(self.errors) if self.errors is not None else 0
        for kn, vn in node.value:
            key = str(kn.value)
            sub = f"{path}.{key}" if path else key
            if key not in fields:
                near = ", ".join(sorted(fields))
                self.report(self.err(kn, sub, f"unknown key (known: {near})"))
                continue
            if key in seen:
                self.report(self.err(kn, sub, "duplicate key"))
                continue
            seen.add(key)
            try:
                f = fields[key]
                if dataclasses.is_dataclass(hints[key]) and f.default_factory is not dataclasses.MISSING:
                    kwargs[key] = self.dataclass(hints[key], vn, sub, base=f.default_factory())
                else:
                    kwargs[key] = self.convert(hints[key], vn, sub)
            except ConfigError as e:
                self.report(e)
        if self.errors is not None and len(self.errors) > before:
            # Something below was wrong: the object is a stand-in (defaults where the file was
            # wrong) so the rest of the file can still be checked; its validate() would judge
            # values the file does not hold.
            try:
                return make(**kwargs)
            except (TypeError, ValueError):
                return make()
        try:
            obj = make(**kwargs)
        except (TypeError, ValueError) as e:
            raise self.err(node, path, str(e)) from None
        validate = getattr(obj, "validate", None)
        if validate is not None:
            problem = validate()
            if problem:
                key, msg = problem
                sub = f"{path}.{key}" if path else key
                raise self.err(_find(node, key), sub, msg)
        return obj


def _find(node: yaml.Node, key: str) -> yaml.Node:
    """The node of a dotted key below `node` (a validate() may name a nested key), or the deepest
    mapping on the way when the key was left at its default (so the line is still near)."""
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        found = next((v for k, v in node.value if k.value == part), None)
        if found is None:
            break
        node = found
    return node


def load_text(cls: type[Any], text: str, source: str) -> Any:
    """Parse `text` into `cls`; an empty document gives all defaults. Raises the first error
    (`check_text` lists them all)."""
    obj, errors = _load(cls, text, source)
    if errors:
        raise errors[0]
    return obj


def check_text(cls: type[Any], text: str, source: str) -> list[ConfigError]:
    """Every error in `text`, in file order (empty when it loads)."""
    return _load(cls, text, source)[1]


def _load(cls: type[Any], text: str, source: str) -> tuple[Any, list[ConfigError]]:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        line = e.problem_mark.line + 1 if e.problem_mark else 0
        return None, [ConfigError(source, line, "", f"invalid YAML: {e.problem}")]
    except yaml.YAMLError as e:  # the reader's errors (a NUL, a control character) carry no mark
        return None, [ConfigError(source, 0, "", "invalid YAML: " + " ".join(str(e).split()))]
    except RecursionError:
        return None, [ConfigError(source, 0, "", "invalid YAML: nested too deeply")]
    if node is None:
        return cls(), []
    errors: list[ConfigError] = []
    try:
        obj = _Loader(source, errors).dataclass(cls, node, "")
    except RecursionError:  # an alias that contains itself (`&a [*a]`)
        return None, [ConfigError(source, 0, "", "invalid YAML: nested too deeply (a recursive alias?)")]
    except ConfigError as e:  # the document itself is not a mapping
        errors.append(e)
    errors.sort(key=lambda e: e.line)  # stable: one line's errors keep their order
    return (None if errors else obj), errors


def read_file(path: Path | str) -> tuple[str, str]:
    """(text, the name errors use) of a config file, or ConfigError."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8"), p.name
    except OSError as e:
        raise ConfigError(str(p), 0, "", f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(p), 0, "", "not UTF-8 text") from None


def load_file(cls: type[Any], path: Path | str) -> Any:
    return load_text(cls, *read_file(path))


def line_of(text: str, key: str) -> int:
    """The line of a dotted key in a YAML document (of its nearest present parent; 0 if none)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return 0
    if node is None:
        return 0
    found = _find(node, key)
    return found.start_mark.line + 1 if found is not node else 0


# ---- the commented default ---------------------------------------------------------------


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, Path):
        v = str(v)
    if isinstance(v, (tuple, list)):
        return "[]" if not v else yaml.safe_dump(list(v), default_flow_style=True).strip()
    if isinstance(v, typing.Mapping):
        return "{}" if not v else yaml.safe_dump(dict(v), default_flow_style=True).strip()
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("\n...").removesuffix("...").strip()


SECRET_FIELDS = ("token", "secret", "password")


def render_default(obj: Any, indent: int = 0, *, mask: bool = False) -> str:
    """A commented YAML rendering of a config object (used with all defaults; `podhealth config
    show` renders a loaded one, `mask` hiding the value of every token, secret and password)."""
    lines: list[str] = []
    pad = "  " * indent
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if mask and value and isinstance(value, str) and any(w in f.name for w in SECRET_FIELDS):
            value = "<hidden>"
        elif mask and isinstance(value, typing.Mapping) and value:
            # a site check's env: {API_TOKEN: ...}
            value = {k: "<hidden>" if isinstance(k, str) and any(w in k.lower() for w in SECRET_FIELDS) else v
                     for k, v in value.items()}
        text = f.metadata.get("doc", "")
        for dl in text.splitlines():
            lines.append(f"{pad}# {dl}")
        if dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            lines.append(render_default(value, indent + 1, mask=mask))
        elif isinstance(value, typing.Mapping) and value and dataclasses.is_dataclass(next(iter(value.values()))):
            lines.append(f"{pad}{f.name}:")
            for key, item in value.items():
                lines.append(f"{pad}  {key}:")
                lines.extend(s for s in render_default(item, indent + 2, mask=mask).splitlines()
                             if not s.lstrip().startswith("#"))
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            lines.append(f"{pad}{f.name}:")
            for item in value:
                sub = render_default(item, indent + 2, mask=mask).splitlines()
                sub = [s for s in sub if not s.lstrip().startswith("#")]
                lines.append(f"{pad}  - {sub[0].strip()}")
                lines.extend(f"{pad}    {s.strip()}" for s in sub[1:])
        else:
            lines.append(f"{pad}{f.name}: {_yaml_scalar(value)}")
    return "\n".join(lines)
