"""OpenAI's `strict` for a JSON schema: refuse, naming the keyword and its JSON pointer,
what the grammar converter would drop, so that a schema is never silently loosened.

The converter (llama-cpp-python's SchemaConverter, as model/grammar_sources.py runs it) reads each node one way, the
first that applies, and enforces only that way's keywords: `$ref` (nothing beside it); `anyOf` or `oneOf` (oneOf as
anyOf); a list `type` (any value of each type, nothing beside); `const` or `enum` (the values as listed);
`properties` or `additionalProperties` not true (an object: `required`, and `additionalProperties` absent means
false); `allOf` (one object with every part's `properties`, all required); `items` or `prefixItems` (with
`minItems`, `maxItems`); `pattern`; `format` date, time, date-time or uuid; `type: string` with `minLength` or
`maxLength`; `type: object` or nothing (any object); one other `type` (any value of it).

A keyword is refused when it asserts something (not an annotation or an unknown word: validators ignore those too),
the node's way drops it, and it applies to what that way writes (`maxLength` beside an object is moot); so is a
`pattern` that could write raw what a JSON string must escape (schema_pattern.py). The walk follows what the
converter visits, each `$ref` target once, so recursive schemas end.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

from .errors import InvalidRequest
from .schema_pattern import unsafe_piece
from .schema_pointer import escape_token, resolve_pointer

_JSON_TYPES = frozenset(("null", "boolean", "object", "array", "number", "integer", "string"))
_KEYWORD_TYPE = {  # the instance type a keyword applies to; the others apply to every type
    **dict.fromkeys(("minLength", "maxLength", "pattern", "format"), "string"),
    **dict.fromkeys(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), "number"),
    **dict.fromkeys(("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains",
                     "maxContains", "unevaluatedItems"), "array"),
    **dict.fromkeys(("properties", "patternProperties", "additionalProperties", "required", "minProperties",
                     "maxProperties", "propertyNames", "dependentRequired", "dependentSchemas", "dependencies",
                     "unevaluatedProperties"), "object"),
}
_ASSERTING = frozenset((*_KEYWORD_TYPE, "type", "enum", "const", "allOf", "anyOf", "oneOf", "not", "if", "$ref",
                        "$dynamicRef", "$recursiveRef"))
_NO_OPS = {"uniqueItems": False, "minItems": 0, "minLength": 0, "minProperties": 0, "required": [],
           "additionalProperties": True}  # values that assert nothing
_FORMATS, _MAX_ONE_OF = ("date", "time", "date-time", "uuid"), 256  # formats it writes; oneOf options compared


class _Dropped(Exception):
    def __init__(self, path: str, keyword: str, why: str) -> None:
        super().__init__(f"`{keyword}` at {path}/{escape_token(keyword)}: {why}")


def check_strict(schema: Any, field: str) -> None:
    """InvalidRequest naming `field`, the first keyword (by its JSON pointer) that the converter would not enforce,
    and why. A schema the converter cannot read at all is left to it (it refuses it when compiling)."""
    try:
        _walk(schema)
    except _Dropped as dropped:
        message = f"strict: the grammar converter does not enforce {dropped}; change the schema, or send it without strict"
        raise InvalidRequest(message, field=field) from None


def _walk(root: Any) -> None:
    seen_refs: set[int] = set()  # targets by identity: many spellings of one pointer cost one walk
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue  # the converter refuses a boolean schema itself
        if node.get("$ref") is not None:
            target = _follow(node, path, root)
            if target is not None and id(target[0]) not in seen_refs:
                seen_refs.add(id(target[0]))
                stack.append(target)
            continue
        stack.extend(reversed(_children(node, path, root)))


def _follow(node: dict[str, Any], path: str, root: Any) -> tuple[Any, str] | None:
    """A `$ref` node's target and its pointer, after refusing what is beside the reference
    (None when the converter refuses the reference itself)."""
    _leftovers(node, path, {"$ref"}, _JSON_TYPES, "beside $ref (the converter reads only the reference)")
    try:
        return resolve_pointer(root, node["$ref"]), unquote(node["$ref"][1:])
    except ValueError:
        return None


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def _int(value: Any, default: int | None) -> int | None:  # a count, when it is one
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _leftovers(node: dict[str, Any], path: str, consumed: set[str], types: frozenset[str] | set[str],
               why: str) -> None:
    """Refuse the first asserting keyword of `node` that the way it is read does not consume
    and that applies to the `types` of value that way writes."""
    types = set(types) | ({"number"} if "integer" in types else set())
    for key, value in node.items():
        if key in consumed or key not in _ASSERTING or _KEYWORD_TYPE.get(key, "any") not in {*types, "any"}:
            continue
        if key in _NO_OPS and value == _NO_OPS[key] and type(value) is type(_NO_OPS[key]):
            continue
        if key == "format" and value not in _FORMATS:
            why = f"{value!r} is not a format it knows ({', '.join(_FORMATS)})"
        raise _Dropped(path, key, why)


def _alternatives(node: dict[str, Any], path: str, root: Any) -> list[tuple[Any, str]]:
    """oneOf or anyOf (the converter reads oneOf when it has any, else anyOf)."""
    key = "oneOf" if node.get("oneOf") else "anyOf"
    options = node.get(key)
    if not isinstance(options, list):
        return []
    if not options:
        raise _Dropped(path, key, "is empty (the converter would write nothing)")
    if key == "oneOf" and not _apart(options, root):
        raise _Dropped(path, key, "is read as anyOf: more than one alternative could match; use anyOf, or "
                                  "alternatives told apart by type or by a required const property")
    _leftovers(node, path, {key}, _JSON_TYPES, f"beside {key} (the converter reads only the alternatives)")
    return [(option, f"{path}/{key}/{i}") for i, option in enumerate(options)]


def _children(node: dict[str, Any], path: str, root: Any) -> list[tuple[Any, str]]:
    """The subschemas the converter visits under `node`, after refusing what it drops (as the converter's `visit`)."""
    kind = node.get("type")
    if "oneOf" in node or "anyOf" in node:
        return _alternatives(node, path, root)
    if isinstance(kind, list):
        if not kind or not all(isinstance(t, str) and t in _JSON_TYPES for t in kind):
            raise _Dropped(path, "type", "must be JSON types, at least one")
        _leftovers(node, path, {"type"}, set(kind), "beside a list of types (it writes any value of each; use anyOf)")
        return []
    if "const" in node or "enum" in node:
        _check_values(node, path)
        return []
    if kind in (None, "object") and ("properties" in node or node.get("additionalProperties", True) is not True):
        return _object(node, path)
    if kind in (None, "object") and "allOf" in node:
        return _all_of(node, path, root)
    if kind in (None, "array") and ("items" in node or "prefixItems" in node):
        return _array(node, path)
    fmt = node.get("format")
    if kind in (None, "string") and ("pattern" in node or fmt in _FORMATS):
        _leftovers(node, path, {"type", "pattern" if "pattern" in node else "format"}, {"string"},
                   "beside pattern or format (the converter reads only that)")
        piece = unsafe_piece(node["pattern"]) if isinstance(node.get("pattern"), str) else None
        if piece:
            raise _Dropped(path, "pattern", f"its {piece!r} can write a quote, backslash or control character raw in "
                                            "the JSON string (the reply may not parse); list the characters allowed")
    elif kind == "string" and ("minLength" in node or "maxLength" in node):
        low, high = _int(node.get("minLength"), 0), _int(node.get("maxLength"), None)
        if low is not None and high is not None and high < low:
            raise _Dropped(path, "maxLength", "is less than minLength")
        _leftovers(node, path, {"type", "minLength", "maxLength"}, {"string"}, "beside minLength or maxLength")
    elif kind == "object" or not node:
        _leftovers(node, path, {"type"}, {"object"}, "in an object without properties (it writes any object)")
    elif isinstance(kind, str) and kind not in _JSON_TYPES:
        raise _Dropped(path, "type", f"{kind!r} is not a JSON type")
    else:  # one type, or none that the converter can read (it refuses such a node)
        types, why = ({kind}, f"it writes any {kind}") if isinstance(kind, str) else (_JSON_TYPES, "no way to read it")
        _leftovers(node, path, {"type"}, types, why)
    return []


def _check_values(node: dict[str, Any], path: str) -> None:
    key = "const" if "const" in node else "enum"
    values = [node["const"]] if key == "const" else node["enum"]
    if not isinstance(values, list) or not values:
        raise _Dropped(path, key, "must be a non-empty array")
    consumed = {key}
    kind = node.get("type")
    if kind is not None:
        if not isinstance(kind, str):
            raise _Dropped(path, "type", "must be a JSON type")
        allowed = {kind}
        for value in values:
            if not (_type_of(value) in allowed or (_type_of(value) == "integer" and "number" in allowed)):
                raise _Dropped(path, "type", f"{key} lists {json.dumps(value)}, not of this type (the converter "
                                             "writes the values as listed)")
        consumed.add("type")
    if key == "const" and "enum" in node:
        same = json.dumps(node["const"], sort_keys=True)
        if not isinstance(node["enum"], list) or all(json.dumps(v, sort_keys=True) != same for v in node["enum"]):
            raise _Dropped(path, "enum", "does not list the const (the converter writes the const)")
        consumed.add("enum")
    _leftovers(node, path, consumed, {_type_of(v) for v in values},
               f"beside {key} (the converter writes the values as listed, unchecked)")


def _object(node: dict[str, Any], path: str) -> list[tuple[Any, str]]:
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        return []
    required = node.get("required", [])
    for name in required if isinstance(required, list) else []:
        if isinstance(name, str) and name not in properties:  # a name that is not a string: the converter refuses
            raise _Dropped(path, "required", f"names {name!r}, which properties does not define (the converter "
                                             "writes defined properties only)")
    extra = node.get("additionalProperties")
    if properties and (extra is True or isinstance(extra, dict)):
        raise _Dropped(path, "additionalProperties", "is allowed beside properties: the converter's extra keys "
                                                     "may repeat a property with another value; set it to false")
    _leftovers(node, path, {"type", "properties", "required", "additionalProperties"}, {"object"},
               "in an object with properties (the converter reads properties, required, additionalProperties)")
    children = [(schema, f"{path}/properties/{escape_token(name)}") for name, schema in properties.items()]
    return children + ([(extra, f"{path}/additionalProperties")] if isinstance(extra, dict) else [])


def _all_of(node: dict[str, Any], path: str, root: Any) -> list[tuple[Any, str]]:
    parts = node["allOf"]
    if not isinstance(parts, list):
        return []
    names: set[str] = set()
    closed: list[tuple[str, set[str]]] = []
    children: list[tuple[Any, str]] = []
    required = list(node.get("required", [])) if isinstance(node.get("required"), list) else []
    for i, part in enumerate(parts):
        where = f"{path}/allOf/{i}"
        if not isinstance(part, dict):
            return []
        if "anyOf" in part:
            raise _Dropped(where, "anyOf", "inside allOf (the converter makes its properties optional, none required)")
        if part.get("$ref") is not None:
            target = _follow(part, where, root)
            if target is None or not isinstance(target[0], dict):
                return []
            part, where = target
        properties = part.get("properties", {})
        if not isinstance(properties, dict):
            return []
        consumed = {"properties", "required"} | ({"type"} if part.get("type", "object") == "object" else set())
        if part.get("additionalProperties") is False:
            consumed.add("additionalProperties")
            closed.append((where, set(properties)))
        _leftovers(part, where, consumed, {"object"}, "in an allOf part (the converter takes only its properties)")
        for name, schema in properties.items():
            if name in names:
                raise _Dropped(where, "properties", f"repeats {name!r} from another allOf part (it would be written twice)")
            names.add(name)
            children.append((schema, f"{where}/properties/{escape_token(name)}"))
        required += part.get("required", []) if isinstance(part.get("required"), list) else []
    for where, own in closed:
        if own != names:
            raise _Dropped(where, "additionalProperties", "is false, but the other allOf parts add properties")
    for name in required:
        if isinstance(name, str) and name not in names:
            raise _Dropped(path, "required", f"names {name!r}, which no allOf part defines")
    _leftovers(node, path, {"type", "allOf", "required"}, {"object"}, "beside allOf")
    return children


def _array(node: dict[str, Any], path: str) -> list[tuple[Any, str]]:
    used = "items" if node.get("items") else "prefixItems"  # the converter: items or prefixItems
    items = node.get(used)
    low, high = _int(node.get("minItems"), 0), _int(node.get("maxItems"), None)
    consumed = {"type", used, "minItems", "maxItems"}
    if isinstance(items, list):  # a tuple: exactly these items
        consumed.add("items")  # when prefixItems is used, items is absent or false-like: nothing follows them
        if (low or 0) > len(items) or (high is not None and high < len(items)):
            raise _Dropped(path, "minItems" if (low or 0) > len(items) else "maxItems", f"does not allow the "
                                                                                       f"{len(items)} items it writes")
        children = [(item, f"{path}/{used}/{i}") for i, item in enumerate(items)]
    elif isinstance(items, dict):
        if low is not None and high is not None and high < low:
            raise _Dropped(path, "maxItems", "is less than minItems")
        children = [(items, f"{path}/items")]
    else:
        return []
    _leftovers(node, path, consumed, {"array"}, "in an array (it reads items, prefixItems, minItems, maxItems)")
    return children


def _apart(options: list[Any], root: Any) -> bool:
    """Whether no value can match two of oneOf's alternatives: each pair differs in its single type, or in the const
    of a property both require."""
    shapes: list[tuple[str | None, dict[str, str]]] = []
    for option in options if len(options) <= _MAX_ONE_OF else [None]:  # too many to compare: not proven
        try:
            option = resolve_pointer(root, option["$ref"]) if isinstance(option, dict) and "$ref" in option else option
            kind = option["type"] if isinstance(option.get("type"), str) else None
        except (ValueError, AttributeError):  # not a schema the converter reads
            return False
        properties = option["properties"] if isinstance(option.get("properties"), dict) else {}
        required = option["required"] if isinstance(option.get("required"), list) else []
        tags = {name: json.dumps(properties[name]["const"], sort_keys=True) for name in required
                if isinstance(name, str) and isinstance(properties.get(name), dict) and "const" in properties[name]}
        shapes.append((kind, tags))
    for i, (kind_a, tags_a) in enumerate(shapes):
        for kind_b, tags_b in shapes[i + 1:]:
            by_type = kind_a and kind_b and kind_a != kind_b and {kind_a, kind_b} != {"integer", "number"}
            if not by_type and not any(tags_b.get(name, value) != value for name, value in tags_a.items()):
                return False
    return True
