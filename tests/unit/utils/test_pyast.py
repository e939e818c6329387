"""Expression parsing from many threads at once (environment steps and rewards run in worker threads)."""

import ast
from concurrent.futures import ThreadPoolExecutor

from tandem.utils.pyast import parse_expression


def test_parses_from_many_threads_agree_with_a_single_thread():
    texts = ["(" * depth + "1+2" + ")" * depth + f"*{depth}" for depth in range(1, 60)] * 20
    expected = [ast.dump(ast.parse(t, mode="eval")) for t in texts]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: ast.dump(parse_expression(t)), texts))
    assert got == expected
