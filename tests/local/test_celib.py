"""The Kubernetes CEL libraries added to cel-python: each function against the examples its documentation gives
(cel-go ext/strings.go; k8s.io/apiserver pkg/cel/library lists.go, regex.go, urls.go), and each is absent from plain
cel-python, so a rule using it could not be evaluated without them."""

from __future__ import annotations

from typing import Any

import celpy
import pytest

from moelora.local.apiserver import celib


def evaluate(expression: str, *, library: bool = True) -> Any:
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression), functions=celib.FUNCTIONS if library else None)
    return program.evaluate({})


TRUE = [
    # strings
    "'hello'.charAt(4) == 'o'",
    "'hello'.charAt(5) == ''",
    "'hello mellow'.indexOf('') == 0",
    "'hello mellow'.indexOf('ello') == 1",
    "'hello mellow'.indexOf('jello') == -1",
    "'hello mellow'.indexOf('', 2) == 2",
    "'hello mellow'.indexOf('ello', 2) == 7",
    "'hello mellow'.lastIndexOf('') == 12",
    "'hello mellow'.lastIndexOf('ello') == 7",
    "'hello mellow'.lastIndexOf('ello', 6) == 1",
    "'TacoCat'.lowerAscii() == 'tacocat'",
    "'TacoCÆt Xii'.lowerAscii() == 'tacocÆt xii'",
    "'TacoCat'.upperAscii() == 'TACOCAT'",
    "'hello hello'.replace('he', 'we') == 'wello wello'",
    "'hello hello'.replace('he', 'we', 1) == 'wello hello'",
    "'hello hello'.replace('he', 'we', 0) == 'hello hello'",
    "'hello hello hello'.split(' ') == ['hello', 'hello', 'hello']",
    "'hello hello hello'.split(' ', 0) == []",
    "'hello hello hello'.split(' ', 2) == ['hello', 'hello hello']",
    "'abc'.split('') == ['a', 'b', 'c']",
    "'abc'.split('', 2) == ['a', 'bc']",
    "'tacocat'.substring(4) == 'cat'",
    "'tacocat'.substring(0, 4) == 'taco'",
    "'  \\ttrim\\n    '.trim() == 'trim'",
    "['hello', 'mellow'].join() == 'hellomellow'",
    "['hello', 'mellow'].join(' ') == 'hello mellow'",
    "[].join('/') == ''",
    # lists
    "[1, 2, 3].isSorted()",
    "['a', 'b', 'b', 'c'].isSorted()",
    "![2.0, 1.0].isSorted()",
    "[1, 3].sum() == 4",
    "[1.0, 3.0].sum() == 4.0",
    "[duration('1m'), duration('1s')].sum() == duration('61s')",
    "[].sum() == 0",
    "[3, 1, 2].min() == 1",
    "[3, 1, 2].max() == 3",
    "[1, 2, 3, 2].indexOf(2) == 1",
    "[1, 2, 3, 2].lastIndexOf(2) == 3",
    "[1, 2].indexOf(5) == -1",
    # regex
    "'abc 123'.find('[0-9]+') == '123'",
    "'abc 123'.find('xyz') == ''",
    "'123 abc 456'.findAll('[0-9]+') == ['123', '456']",
    "'123 abc 456'.findAll('[0-9]+', 1) == ['123']",
    "'123 abc 456'.findAll('xyz') == []",
    # urls
    "isURL('https://user:pass@example.com:80/path?query=val#fragment')",
    "isURL('/absolute-path')",
    "!isURL('https://a:b:c/')",
    "!isURL('../relative-path')",
    "url('https://example.com/').getScheme() == 'https'",
    "url('/path').getScheme() == ''",
    "url('https://example.com:80/').getHost() == 'example.com:80'",
    "url('https://[::1]:80/').getHost() == '[::1]:80'",
    "url('/path').getHost() == ''",
    "url('https://example.com:80/').getHostname() == 'example.com'",
    "url('https://[::1]:80/').getHostname() == '::1'",
    "url('https://example.com:80/').getPort() == '80'",
    "url('https://[::1]/').getPort() == ''",
    "url('https://example.com/path with spaces/').getEscapedPath() == '/path%20with%20spaces/'",
    "url('https://example.com').getEscapedPath() == ''",
    "url('https://example.com/path?k1=a&k2=b&k2=c').getQuery() == {'k1': ['a'], 'k2': ['b', 'c']}",
    "url('https://example.com/path').getQuery() == {}",
]

ERRORS = [
    "'hello'.charAt(6)",
    "'hello'.charAt(-1)",
    "'hello mellow'.indexOf('ello', 20)",
    "'hello mellow'.lastIndexOf('ello', -1)",
    "'tacocat'.substring(-1)",
    "'tacocat'.substring(2, 1)",
    "[].min()",
    "[].max()",
    "[1, 2].join()",
    "'abc'.find('[')",
    "url('../relative-path')",
    "url('https://a:b:c/')",
]


@pytest.mark.parametrize("expression", TRUE)
def test_the_documented_examples_hold(expression: str) -> None:
    assert evaluate(expression) is not None and bool(evaluate(expression)), expression


@pytest.mark.parametrize("expression", ERRORS)
def test_out_of_range_and_malformed_arguments_are_errors(expression: str) -> None:
    with pytest.raises(celpy.CELEvalError):
        evaluate(expression)


@pytest.mark.parametrize(
    "expression",
    ["'a'.lowerAscii() == 'a'", "'ab'.replace('a', 'c') == 'cb'", "isURL('/x')", "[1].isSorted()", "'a'.find('a')"],
)
def test_plain_cel_python_lacks_them(expression: str) -> None:
    with pytest.raises(celpy.CELEvalError, match="undeclared reference"):
        evaluate(expression, library=False)
