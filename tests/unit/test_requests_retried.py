"""Every S3 operation fastload calls on a botocore client goes through the retry loop: the call sits in a
``lambda`` handed to ``Retrier.call`` or in a function named ``attempt`` (the convention for the function
a retrier runs). A call outside both (as ``delete_objects`` was, issue 36) fails this test, naming it."""

from __future__ import annotations

import ast
from pathlib import Path

import botocore.session
from botocore import xform_name

PACKAGE = Path(__file__).resolve().parents[2] / "fastload"
OPERATIONS = {
    xform_name(name) for name in botocore.session.get_session().get_service_model("s3").operation_names
}


def unretried_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, operation)`` of S3 operation calls in ``tree`` outside a retried lambda or ``attempt``."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, retried: bool) -> None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in OPERATIONS and not retried:
                found.append((node.lineno, node.func.attr))
            if node.func.attr == "call":  # Retrier.call(lambda: client.op(...), give_up)
                for arg in node.args:
                    visit(arg, retried or isinstance(arg, ast.Lambda))
                for child in [node.func, *node.keywords]:
                    visit(child, retried)
                return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            retried = retried or node.name == "attempt"
        for child in ast.iter_child_nodes(node):
            visit(child, retried)

    visit(tree, False)
    return found


def test_every_s3_operation_call_in_fastload_is_retried() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "testing" in path.relative_to(PACKAGE).parts or "bench" in path.relative_to(PACKAGE).parts:
            continue  # the fault proxy and benchmarks are not fastload's requests
        for line, op in unretried_calls(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {op}")
    assert offenders == [], "S3 requests outside the retry loop:\n" + "\n".join(offenders)


def test_the_check_finds_a_bare_call() -> None:
    bare = "def remove(client):\n    client.delete_objects(Bucket='b', Delete={})\n"
    retried = "def remove(client, r):\n    r.call(lambda: client.delete_objects(Bucket='b'), give_up)\n"
    assert unretried_calls(ast.parse(bare)) == [(2, "delete_objects")]
    assert unretried_calls(ast.parse(retried)) == []
