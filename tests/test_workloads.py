"""The speculation workloads (harness/workloads/prompts.py): deterministic, built without a network, and
each edit prompt holds the real source it asks to edit."""

import difflib
import inspect
import socket
import textwrap

import pytest

from harness.workloads import prompts as wl


def test_the_same_interpreter_builds_the_same_prompts_twice():
    first = [(p.id, p.workload, p.messages, p.sha256) for p in wl.all_prompts()]
    second = [(p.id, p.workload, p.messages, p.sha256) for p in wl.all_prompts()]
    assert first == second
    assert {p.workload for p in wl.all_prompts()} == set(wl.BASE_WORKLOADS) == {"edit", "qa", "prose"}
    everything = wl.all_prompts(wl.WORKLOADS)
    assert {p.workload for p in everything} == {"edit", "qa", "prose", "chat"}
    assert len({p.id for p in everything}) == len(everything) == 5


def test_the_prompts_need_no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the workload builder opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert len(wl.all_prompts()) == 4


def test_edit_prompts_quote_the_installed_source_and_qa_the_installed_documentation():
    edit = {p.id: p.messages[0]["content"] for p in wl.workload("edit")}
    assert inspect.getsource(textwrap.dedent) in edit["edit-dedent-rename"]
    assert "`margin`" in edit["edit-dedent-rename"]
    assert inspect.getsource(difflib.get_close_matches) in edit["edit-close-matches-comment"]
    (qa,) = wl.workload("qa")
    assert inspect.cleandoc(textwrap.TextWrapper.__doc__) in qa.messages[0]["content"]
    (prose,) = wl.workload("prose")
    assert "```" not in prose.messages[0]["content"]


def test_the_chat_prompt_is_three_turns_whose_answer_quotes_the_installed_documentation():
    (chat,) = wl.workload("chat")
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "user"]
    assert inspect.cleandoc(textwrap.shorten.__doc__) in chat.messages[1]["content"]
    assert "30 characters" in chat.messages[2]["content"]


def test_a_prompt_records_its_id_workload_and_digest():
    p = wl.workload("prose")[0]
    assert p.to_dict() == {"id": "prose-lighthouse", "workload": "prose", "sha256": p.sha256}
    assert len(p.sha256) == 64


def test_an_unknown_workload_names_the_known_ones():
    with pytest.raises(wl.WorkloadError, match="unknown workload 'poetry'; known: edit, qa, prose"):
        wl.workload("poetry")


def test_a_source_that_lost_what_its_instruction_names_is_an_error(monkeypatch):
    monkeypatch.setattr(wl, "_source", lambda dotted: "def dedent(text):\n    return text\n")
    with pytest.raises(wl.WorkloadError, match="no longer contains 'margin'"):
        wl.workload("edit")
