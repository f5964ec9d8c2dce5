"""What a configuration file may hold before it is validated: bounds, ``${VAR}``, redaction.

The checks here run on the parsed YAML (plain dicts, lists and scalars), before pydantic sees
it, because each guards against something validation itself would suffer from:

- **Expanded size.**  YAML aliases let a few hundred bytes stand for gigabytes
  ("billion laughs"): ``yaml.safe_load`` shares one object per anchor, so loading is cheap,
  but anything that copies or serialises the value (validation, a probe's request body)
  expands it.  :func:`expanded_size` measures the value as JSON would write it, counting each
  shared object once per reference without ever building it; :func:`size_errors` bounds the
  whole document and each free-form value (``probes[].parameters``).  A recursive alias is
  refused too.
- **Environment variables.**  :func:`expand_env` replaces ``${VAR}``, ``${VAR:-default}``
  (unset or empty) and ``${VAR-default}`` (unset) in string values; ``$${`` is a literal
  ``${``.  An unset variable without a default is an error naming the key and the variable,
  never a value.
- **Redaction.**  Error lines may quote what the user wrote; :func:`redact_text` masks the
  userinfo, query and fragment of every URL in them and every known secret (header values,
  tokens, passwords, webhook URLs, values taken from the environment).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tritonwatch.schemas.values import REDACTED, redact_url_text

#: The whole document, as JSON after expanding every alias.  A 1,000-target file is ~200 KB.
MAX_EXPANDED_BYTES = 16 * 1024 * 1024
#: Each free-form value (one probe's ``parameters``), as JSON after expanding every alias.
MAX_FREE_FORM_BYTES = 64 * 1024
#: A configuration file larger than this is refused before it is parsed.
MAX_FILE_BYTES = 8 * 1024 * 1024
#: Nesting depth of any value (a real config nests 5 levels; every walk here is recursive).
MAX_DEPTH = 64

# Free-form values: (path as a tuple of keys, "*" for any list index).  Validation accepts
# anything there, so only this bound keeps them small.
FREE_FORM: tuple[tuple[str, ...], ...] = (("probes", "*", "parameters"),)

# Keys whose string values are secrets wherever they appear.
_SECRET_KEYS = frozenset({"token", "password", "credentials", "secret", "api_key"})
# The first word of an Authorization value names the scheme; the rest is the secret.
_AUTH_SCHEMES = frozenset({"basic", "bearer", "token", "digest", "negotiate"})


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def key_path(parts: Iterable[str | int]) -> str:
    """``targets[0].headers`` from ``("targets", 0, "headers")``."""
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(top level)"


class RecursiveValue(ValueError):
    """A value contains itself (a YAML alias to one of its own parents), or nests deeper than
    :data:`MAX_DEPTH`."""

    def __init__(self, path: tuple[str | int, ...], message: str | None = None) -> None:
        super().__init__(f"{key_path(path)}: " + (message or (
            "refers to itself (a YAML alias to one of its own parents); recursive values are "
            "not allowed"
        )))
        self.path = path


def expanded_size(
    value: Any,
    path: tuple[str | int, ...] = (),
    memo: dict[int, int] | None = None,
    visit: Callable[[tuple[str | int, ...], int], None] | None = None,
) -> int:
    """Bytes of ``value`` written as compact JSON, every alias expanded; linear in the number
    of *distinct* objects (each container is measured once, then looked up).

    ``visit(path, size)`` is called for each container the first time it is measured.
    Raises :class:`RecursiveValue` for a value that contains itself or nests deeper than
    :data:`MAX_DEPTH`.
    """
    memo = {} if memo is None else memo
    active: set[int] = set()

    def measure(obj: Any, where: tuple[str | int, ...]) -> int:
        if isinstance(obj, str):
            return len(obj.encode("utf-8", "surrogatepass")) + 2
        if obj is None or isinstance(obj, bool | int | float):
            return len(json.dumps(obj))
        if not isinstance(obj, Mapping | list | tuple):
            return len(str(obj)) + 2
        key = id(obj)
        if key in memo:
            return memo[key]
        if key in active:
            raise RecursiveValue(where)
        if len(where) - len(path) >= MAX_DEPTH:
            raise RecursiveValue(where, f"nested more than {MAX_DEPTH} levels deep")
        active.add(key)
        if isinstance(obj, Mapping):
            size = 2 + sum(
                measure(str(k), where) + 1 + measure(v, (*where, str(k)))
                for k, v in obj.items()
            ) + max(0, len(obj) - 1)
        else:
            size = 2 + sum(measure(v, (*where, i)) for i, v in enumerate(obj))
            size += max(0, len(obj) - 1)
        active.discard(key)
        memo[key] = size
        if visit is not None:
            visit(where, size)
        return size

    return measure(value, path)


def _matches(path: tuple[str | int, ...], pattern: tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(
        (p == "*" and isinstance(k, int)) or p == k for k, p in zip(path, pattern, strict=True)
    )


def size_errors(
    data: Any,
    *,
    max_bytes: int = MAX_EXPANDED_BYTES,
    max_free_form: int = MAX_FREE_FORM_BYTES,
    free_form: Iterable[tuple[str, ...]] = FREE_FORM,
) -> list[str]:
    """``key: message`` lines for every bound ``data`` exceeds (empty when it fits): the
    whole of it, and each value at a ``free_form`` path (``"*"`` matches any list index)."""
    free_form = tuple(free_form)
    errors: list[str] = []
    biggest: list[tuple[tuple[str | int, ...], int]] = []

    def visit(path: tuple[str | int, ...], size: int) -> None:
        if size > max_free_form and any(_matches(path, pattern) for pattern in free_form):
            errors.append(
                f"{key_path(path)}: expands to {_fmt_bytes(size)} as JSON (YAML aliases repeat "
                f"their anchor's content each time); the limit is {_fmt_bytes(max_free_form)}"
            )
        if size > max_bytes:
            biggest.append((path, size))

    try:
        total = expanded_size(data, visit=visit)
    except RecursiveValue as exc:
        return [str(exc)]
    if total > max_bytes:
        # Name the deepest value that alone exceeds the bound: that is where the aliases
        # multiply (the root always exceeds it when anything does).
        path, size = max(biggest, key=lambda item: len(item[0]))
        errors.append(
            f"{key_path(path)}: expands to {_fmt_bytes(size)} as JSON (YAML aliases repeat "
            f"their anchor's content each time); a configuration may expand to at most "
            f"{_fmt_bytes(max_bytes)}"
        )
    return errors


# ``$${`` (a literal ``${``) or ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``.
_ENV_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_ENV_BODY_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)(.*))?$", re.DOTALL)


class EnvExpansion:
    """``${VAR}`` expansion over a parsed document; see the module docstring.

    ``errors`` collects one line per problem; ``used`` maps each variable read to its value,
    so error text can be scrubbed of those values.
    """

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.errors: list[str] = []
        self.used: dict[str, str] = {}
        self._memo: dict[int, Any] = {}

    def string(self, text: str, path: tuple[str | int, ...]) -> str:
        if "${" not in text:
            return text

        def replace(match: re.Match[str]) -> str:
            whole = match.group(0)
            if whole == "$${":
                return "${"
            body = match.group(1)
            parsed = _ENV_BODY_RE.match(body) if body is not None else None
            if parsed is None:
                self.errors.append(
                    f"{key_path(path)}: malformed environment reference (use ${{NAME}}, "
                    "${NAME:-default} or ${NAME-default}; write $${ for a literal ${)"
                )
                return ""
            name, op, default = parsed.groups()
            value = self.environ.get(name)
            if value is not None:
                self.used[name] = value
            if (op == ":-" and not value) or (op == "-" and value is None):
                return str(default)
            if value is None:
                self.errors.append(
                    f"{key_path(path)}: environment variable {name} is not set (set it, or "
                    f"write ${{{name}:-default}} for a fallback)"
                )
                return ""
            return value

        return _ENV_RE.sub(replace, text)

    def value(self, obj: Any, path: tuple[str | int, ...] = ()) -> Any:
        """``obj`` with every string expanded; shared (aliased) containers stay shared, so the
        result is no bigger in memory than the input."""
        if isinstance(obj, str):
            return self.string(obj, path)
        if not isinstance(obj, Mapping | list):
            return obj
        key = id(obj)
        if key in self._memo:
            return self._memo[key]
        if isinstance(obj, Mapping):
            out: dict[Any, Any] = {}
            self._memo[key] = out  # before the children: a recursive value stays recursive
            for k, v in obj.items():
                out[k] = self.value(v, (*path, str(k)))
            return out
        items: list[Any] = []
        self._memo[key] = items
        items.extend(self.value(v, (*path, i)) for i, v in enumerate(obj))
        return items


def expand_env(data: Any, environ: Mapping[str, str]) -> tuple[Any, list[str], dict[str, str]]:
    """``(expanded data, error lines, {variable: value} read)``."""
    expansion = EnvExpansion(environ)
    return expansion.value(data), expansion.errors, expansion.used


# --- redaction ------------------------------------------------------------------------------

_URL_IN_TEXT_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")


def secret_strings(data: Any) -> set[str]:
    """Every string of ``data`` that is a secret: header values, tokens and passwords, webhook
    URLs, and the userinfo and query of any URL.  ``data`` must not be recursive."""
    found: set[str] = set()
    seen: set[int] = set()

    def url_parts(text: str) -> None:
        for match in _URL_IN_TEXT_RE.finditer(text):
            url = match.group(0)
            authority = url.partition("://")[2].partition("/")[0].partition("?")[0]
            if "@" in authority:
                userinfo = authority.rpartition("@")[0]
                found.add(userinfo)
                found.add(userinfo.partition(":")[2])
            query = url.partition("?")[2].partition("#")[0]
            if query:
                found.add(query)

    def walk(obj: Any, key: str | None) -> None:
        if isinstance(obj, str):
            url_parts(obj)
            if key in _SECRET_KEYS:
                found.add(obj)
            return
        if not isinstance(obj, Mapping | list | tuple) or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            for k, v in obj.items():
                name = str(k).lower()
                if name == "headers" and isinstance(v, Mapping):
                    found.update(str(h) for h in v.values() if isinstance(h, str))
                    found.update(part for h in v.values() if isinstance(h, str)
                                 for part in h.split() if part.lower() not in _AUTH_SCHEMES)
                if name == "webhooks" and isinstance(v, list):
                    found.update(w["url"] for w in v
                                 if isinstance(w, Mapping) and isinstance(w.get("url"), str))
                walk(v, name)
        else:
            for v in obj:
                walk(v, key)

    walk(data, None)
    # Short fragments ("Bearer", "1") would shred every message and protect nothing.
    return {s for s in found if len(s) >= 4}


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret replaced (longest first), then every URL's credentials
    masked.  Whole secrets go first: a webhook URL must vanish before its query is masked."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return _URL_IN_TEXT_RE.sub(lambda m: redact_url_text(m.group(0), limit=10_000), text)
