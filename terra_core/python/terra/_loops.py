"""Iteration boundaries from the program's own loops.

Terra cuts the stream of ops into iterations so that each one is a short trace that repeats. The
boundaries come from the source: every `for`/`while` loop of the co-executed function (or notebook
cell) gets a call to `__terra_mark__(id)` at the top of its body and after it, where `id` is a
stable number for that loop. Nested function and class definitions are left alone: their ops are
part of the iteration of the loop that calls them.
"""
import ast
import hashlib

EXIT = 0x5A5A_0000_0000_0001
MARK = "__terra_mark__"
# The boundaries of a helper's loops (terra.run: functions defined next to the one it runs): they
# count only while no loop of the run function itself is open (runtime/python_runner.h).
HELPER_MARK = "__terra_mark_helper__"


def stable_id(*parts):
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    # Even and never 0: the entry boundary is 1, and a loop's exit (id ^ EXIT) is odd.
    return (int.from_bytes(digest, "little") | 2) & ~1


def _mark(loop_id, name=MARK):
    return ast.Expr(ast.Call(ast.Name(name, ast.Load()), [ast.Constant(loop_id)], []))


class LoopMarker(ast.NodeTransformer):
    """Adds iteration boundaries to every loop; `scope` makes the ids unique per function/cell.
    With `into_functions`, loops in functions defined here are marked too (a notebook cell's
    functions), as a helper's, otherwise nested definitions are left alone."""

    def __init__(self, scope, into_functions=False, mark=MARK):
        self.scope = scope
        self.into_functions = into_functions
        self.mark = mark
        self.loops = 0

    def _loop(self, node):
        self.generic_visit(node)
        loop_id = stable_id(self.scope, node.lineno, node.col_offset)
        self.loops += 1
        node.body.insert(0, ast.copy_location(_mark(loop_id, self.mark), node))
        after = ast.copy_location(_mark(loop_id ^ EXIT, self.mark), node)
        return [node, after]

    visit_For = visit_While = visit_AsyncFor = _loop

    def _definition(self, node):
        # A function's loops are helpers' (HELPER_MARK): iterations only while no loop of the
        # cell (or of the function being run) is open (runtime/python_runner.h).
        if self.into_functions and not isinstance(node, ast.Lambda):
            outer, self.mark = self.mark, HELPER_MARK
            try:
                self.generic_visit(node)
            finally:
                self.mark = outer
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _definition


def mark_loops(body, scope, into_functions=False, mark=MARK):
    """Marks the loops of a list of statements in place (calls to the builtin named `mark`);
    returns how many loops were marked."""
    marker = LoopMarker(scope, into_functions, mark)
    new_body = []
    for stmt in body:
        out = marker.visit(stmt)
        new_body.extend(out if isinstance(out, list) else [out])
    body[:] = [ast.fix_missing_locations(s) for s in new_body]
    return marker.loops
