"""Finding vLLM's server argument parser, which moves between releases (openai/ in 0.26, launchers/ in 0.32, common/
in 0.33): the first module that exists and defines it wins, and a module that exists but fails to import is an error,
not an older layout. Shown on modules made here; tests/operator/test_vllm_flags.py runs it on the installed vLLM."""

from __future__ import annotations

import sys
import types

import pytest

from moelora.local.vllm_flags import PARSER_MODULES, find_make_arg_parser


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def make_arg_parser(parser: object) -> object:
    return parser


def test_newest_home_first() -> None:
    assert PARSER_MODULES[0] == "vllm.entrypoints.common.cli_args"
    assert PARSER_MODULES[-1] == "vllm.entrypoints.openai.cli_args"


def test_a_missing_module_is_skipped_for_the_next_home(monkeypatch: pytest.MonkeyPatch) -> None:
    _module(monkeypatch, "moelora_fake_old.cli_args", make_arg_parser=make_arg_parser)
    name, found = find_make_arg_parser(("moelora_fake_new.cli_args", "moelora_fake_old.cli_args"))
    assert (name, found) == ("moelora_fake_old.cli_args", make_arg_parser)


def test_a_module_without_the_parser_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    _module(monkeypatch, "moelora_fake_a", something_else=1)
    _module(monkeypatch, "moelora_fake_b", make_arg_parser=make_arg_parser)
    assert find_make_arg_parser(("moelora_fake_a", "moelora_fake_b"))[0] == "moelora_fake_b"


def test_the_first_home_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    def newer(parser: object) -> object:
        return parser

    _module(monkeypatch, "moelora_fake_a", make_arg_parser=newer)
    _module(monkeypatch, "moelora_fake_b", make_arg_parser=make_arg_parser)
    assert find_make_arg_parser(("moelora_fake_a", "moelora_fake_b"))[1] is newer


def test_a_broken_module_is_an_error_not_an_older_layout(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "moelora_fake_broken.py").write_text("import moelora_fake_dependency_that_is_not_there\n")
    _module(monkeypatch, "moelora_fake_b", make_arg_parser=make_arg_parser)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="moelora_fake_dependency_that_is_not_there"):
        find_make_arg_parser(("moelora_fake_broken", "moelora_fake_b"))


def test_none_found_names_every_home() -> None:
    with pytest.raises(ImportError, match="moelora_fake_x, moelora_fake_y"):
        find_make_arg_parser(("moelora_fake_x", "moelora_fake_y"))
