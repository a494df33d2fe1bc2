"""Chat prompts for three workloads that decide where speculative decoding pays.

- ``edit``: a function from the Python standard library's own source plus an edit instruction; the answer
  restates most of the function, so the prompt holds most of what the model will write (prompt lookup
  and suffix decoding find their drafts there).
- ``qa``: a documentation text (a standard-library docstring) and a question answered by quoting it.
- ``prose``: free writing with nothing to copy.
- ``chat``: a multi-turn conversation: an earlier question, the assistant's earlier answer (a standard-library
  docstring) and a follow-up that asks for an example and an explanation: some of the answer can be copied
  from the conversation, most cannot.

The sources are read with :func:`inspect.getsource` / ``__doc__`` from the interpreter running the
harness, so a prompt is a pure function of the Python version: every prompt carries the sha256 of its
text, and every artifact records it, so two runs on different interpreters are seen to differ.

    >>> from harness.workloads.prompts import workload
    >>> [p.id for p in workload("edit")]
    ['edit-dedent-rename', 'edit-close-matches-comment']
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass

__all__ = ["Prompt", "WORKLOADS", "BASE_WORKLOADS", "workload", "all_prompts", "WorkloadError"]


class WorkloadError(ValueError):
    """An unknown workload, or a source that no longer holds what its instruction names."""


@dataclass(frozen=True)
class Prompt:
    """One chat request: ``messages`` in OpenAI chat form; ``sha256`` of the joined message texts."""

    id: str
    workload: str
    messages: tuple[dict[str, str], ...]

    @property
    def sha256(self) -> str:
        """Hex sha256 of the messages' contents joined by NUL: changes whenever the text does."""
        return hashlib.sha256("\0".join(m["content"] for m in self.messages).encode()).hexdigest()

    def to_dict(self) -> dict:
        """``{"id", "workload", "sha256"}``: what an artifact records of the prompt."""
        return {"id": self.id, "workload": self.workload, "sha256": self.sha256}


def _source(dotted: str) -> str:
    """The source text of a standard-library function or method named ``module.attr[.attr]``."""
    module_name, _, rest = dotted.partition(":")
    obj = importlib.import_module(module_name)
    for part in rest.split("."):
        obj = getattr(obj, part)
    return inspect.getsource(obj)


def _doc(dotted: str) -> str:
    module_name, _, rest = dotted.partition(":")
    obj = importlib.import_module(module_name)
    for part in filter(None, rest.split(".")):
        obj = getattr(obj, part)
    return inspect.cleandoc(obj.__doc__)


def _edit(pid: str, dotted: str, instruction: str, must_contain: str) -> Prompt:
    source = _source(dotted)
    if must_contain not in source:
        raise WorkloadError(f"{pid}: {dotted}'s source no longer contains {must_contain!r}; choose another function")
    text = (f"Here is a Python function:\n\n```python\n{source}```\n\n{instruction} "
            "Reply with the whole edited function in one Python code block and nothing else.")
    return Prompt(pid, "edit", ({"role": "user", "content": text},))


def _qa(pid: str, dotted: str, question: str) -> Prompt:
    text = (f"Answer from this documentation only.\n\n<documentation>\n{_doc(dotted)}\n</documentation>\n\n"
            f"{question}")
    return Prompt(pid, "qa", ({"role": "user", "content": text},))


def _prose(pid: str, text: str) -> Prompt:
    return Prompt(pid, "prose", ({"role": "user", "content": text},))


def _chat(pid: str, dotted: str, first: str, follow_up: str) -> Prompt:
    return Prompt(pid, "chat", ({"role": "user", "content": first},
                                {"role": "assistant", "content": f"From its documentation:\n\n{_doc(dotted)}"},
                                {"role": "user", "content": follow_up}))


def _build() -> dict[str, list[Prompt]]:
    return {
        "edit": [
            _edit("edit-dedent-rename", "textwrap:dedent",
                  "Rename the variable `margin` to `common_indent` everywhere in it.", "margin"),
            _edit("edit-close-matches-comment", "difflib:get_close_matches",
                  "Add a short comment above every `if` statement; change nothing else.", "if "),
        ],
        "qa": [
            _qa("qa-textwrap-attributes", "textwrap:TextWrapper",
                "List every attribute this documentation describes, and for each one quote the documentation's "
                "own sentence about it."),
        ],
        "prose": [
            _prose("prose-lighthouse",
                   "Write a short story about a lighthouse keeper who finds a letter addressed to someone who "
                   "lived a hundred years ago."),
        ],
        "chat": [
            _chat("chat-shorten-example", "textwrap:shorten", "What does Python's textwrap.shorten do?",
                  "Thanks. Show me a small example that shortens a long sentence to 30 characters with a custom "
                  "placeholder, and explain what each argument you pass does."),
        ],
    }


WORKLOADS = ("edit", "qa", "prose", "chat")
"""The workloads, in the order a runner measures them."""

BASE_WORKLOADS = ("edit", "qa", "prose")
"""What :func:`all_prompts` gives by default: the workloads the speculation, load and soak artifacts before
``chat`` measured (their runners ask for these, so their prompts stay the same)."""


def workload(name: str) -> list[Prompt]:
    """The prompts of workload ``name`` (one of :data:`WORKLOADS`).

    Raises:
        WorkloadError: unknown name, or a source that lost what its instruction names.
    """
    if name not in WORKLOADS:
        raise WorkloadError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return _build()[name]


def all_prompts(names: tuple[str, ...] = BASE_WORKLOADS) -> list[Prompt]:
    """Every prompt of the named workloads, workload by workload."""
    return [p for n in names for p in workload(n)]
