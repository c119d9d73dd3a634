"""The trusted LeetCode runner. Its *source* is sent into the sandbox with every request
(`RUNNER_SOURCE` in harness.py); it must stay self-contained: stdlib only, no codeq imports.

`run_call(namespace, call)` runs one test against the program loaded in `namespace` and returns
a JSON-serializable value; expected outputs never come in here.

call = {"kind": "function", "method": str, "args": [...], "arg_kinds": [...],
        "returns": "plain" | "tree" | "linked_list", "inplace": bool}
     | {"kind": "design", "class": str, "ops": [...], "args": [[...], ...], "ctor_kinds": [...]}
arg kinds: plain | float | tree | linked_list | tree_list | linked_list_list | tree_ref |
           linked_list_cycle ([values, pos]: the tail links to node pos)
"with_first_arg": return [result, first argument] (LeetCode's "k, nums = [...]" outputs)
"""

import math
from collections import deque

MAX_NODES = 200_000


def _tree_from_list(values, tree_class):
    if not values or values[0] is None:
        return None
    root = tree_class(values[0])
    queue = deque([root])
    index = 1
    while queue and index < len(values):
        node = queue.popleft()
        if index < len(values) and values[index] is not None:
            node.left = tree_class(values[index])
            queue.append(node.left)
        index += 1
        if index < len(values) and values[index] is not None:
            node.right = tree_class(values[index])
            queue.append(node.right)
        index += 1
    return root


def _tree_to_list(root):
    values: list = []
    queue = deque([root])
    seen = 0
    while queue:
        node = queue.popleft()
        seen += 1
        if seen > MAX_NODES:
            raise ValueError("tree too large or cyclic")
        if node is None:
            values.append(None)
            continue
        values.append(_jsonable(node.val))
        queue.append(node.left)
        queue.append(node.right)
    while values and values[-1] is None:
        values.pop()
    return values


def _linked_from_list(values, node_class):
    head = None
    for value in reversed(values or []):
        head = node_class(value, head)
    return head


def _linked_with_cycle(values, pos, node_class):
    head = _linked_from_list(values, node_class)
    if pos is None or pos < 0:
        return head
    if pos >= len(values):
        raise ValueError(f"pos {pos} is outside the list")
    nodes = []
    node = head
    while node is not None:
        nodes.append(node)
        node = node.next
    nodes[-1].next = nodes[pos]
    return head


def _linked_to_list(head):
    values: list = []
    while head is not None:
        values.append(_jsonable(head.val))
        if len(values) > MAX_NODES:
            raise ValueError("linked list too long or cyclic")
        head = head.next
    return values


def _quad_to_list(root):
    """LeetCode's quad-tree form: level order of [isLeaf, val], null for absent children."""
    values: list = []
    queue = deque([root])
    while queue:
        node = queue.popleft()
        if len(values) > MAX_NODES:
            raise ValueError("quad tree too large or cyclic")
        if node is None:
            values.append(None)
            continue
        # any val is accepted on inner nodes; LeetCode prints them as 1
        leaf = bool(node.isLeaf)
        values.append([int(leaf), int(bool(node.val)) if leaf else 1])
        queue.extend([node.topLeft, node.topRight, node.bottomLeft, node.bottomRight])
    while values and values[-1] is None:
        values.pop()
    return values


def _is_quad(value):
    return hasattr(value, "isLeaf") and hasattr(value, "topLeft")


def _is_tree(value):
    return hasattr(value, "val") and hasattr(value, "left") and hasattr(value, "right")


def _is_linked(value):
    return hasattr(value, "val") and hasattr(value, "next") and not _is_tree(value)


def _jsonable(value):
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return repr(value)
        return value
    if _is_quad(value):
        return _quad_to_list(value)
    if _is_tree(value):
        return _tree_to_list(value)
    if _is_linked(value):
        return _linked_to_list(value)
    if isinstance(value, list | tuple | deque):
        return [_jsonable(item) for item in value]
    if isinstance(value, set | frozenset):
        items = [_jsonable(item) for item in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if hasattr(value, "__iter__"):
        return [_jsonable(item) for item in value]
    if hasattr(value, "__index__"):
        return int(value)
    if hasattr(value, "__float__"):
        return float(value)
    raise TypeError(f"cannot return a {type(value).__name__} as a test result")


def _find_by_value(root, value):
    queue = deque([root])
    while queue:
        node = queue.popleft()
        if node is None:
            continue
        if node.val == value:
            return node
        queue.append(node.left)
        queue.append(node.right)
    raise ValueError(f"no tree node with value {value!r}")


def _convert_args(namespace, values, kinds):
    tree_class = namespace.get("TreeNode")
    list_class = namespace.get("ListNode")
    converted = []
    first_tree = None
    for value, kind in zip(values, kinds, strict=True):
        if kind == "tree":
            value = _tree_from_list(value, tree_class)
            if first_tree is None:
                first_tree = value
        elif kind == "linked_list":
            value = _linked_from_list(value, list_class)
        elif kind == "tree_list":
            value = [_tree_from_list(item, tree_class) for item in value]
        elif kind == "linked_list_list":
            value = [_linked_from_list(item, list_class) for item in value]
        elif kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif kind == "linked_list_cycle":
            value = _linked_with_cycle(value[0], value[1], list_class)
        elif kind == "tree_ref":
            value = _find_by_value(first_tree, value)
        converted.append(value)
    return converted


def _run_function(namespace, call):
    solution_class = namespace.get("Solution")
    if solution_class is None:
        raise NameError("the program defines no class Solution")
    method = getattr(solution_class(), call["method"])
    args = _convert_args(namespace, call["args"], call["arg_kinds"])
    result = method(*args)
    if call.get("inplace"):
        return _jsonable(args[0])
    if call.get("with_first_arg"):
        return [_jsonable(result), _jsonable(args[0])]
    returns = call.get("returns")
    if result is None and returns in ("tree", "linked_list"):
        return []
    if isinstance(result, list) and returns in ("tree_list", "linked_list_list"):
        return [[] if item is None else _jsonable(item) for item in result]
    return _jsonable(result)


def _run_design(namespace, call):
    design_class = namespace.get(call["class"])
    if design_class is None:
        raise NameError(f"the program defines no class {call['class']}")
    ops, args = call["ops"], call["args"]
    ctor_args = _convert_args(
        namespace, args[0], call.get("ctor_kinds") or ["plain"] * len(args[0])
    )
    instance = design_class(*ctor_args)
    results = [None]
    for op, op_args in zip(ops[1:], args[1:], strict=True):
        results.append(_jsonable(getattr(instance, op)(*op_args)))
    return results


def run_call(namespace, call):
    if call["kind"] == "design":
        return _run_design(namespace, call)
    return _run_function(namespace, call)
