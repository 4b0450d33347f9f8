"""The chapter's short quiz: questions, choices and a checker (plain functions, no widgets).

Kept separate so a course-wide quiz helper can replace it: :data:`QUESTIONS` holds the data,
:func:`check_answers` grades a dict ``{question number: choice letter}``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    """One multiple-choice question: ``choices`` maps letters to text; ``answer`` is a letter."""

    text: str
    choices: dict[str, str]
    answer: str
    why: str


QUESTIONS: list[Question] = [
    Question("In Megatron-style tensor parallelism of one GPT-2 block, how many all-reduces does a forward pass need?",
             {"a": "none", "b": "one, after the MLP", "c": "two: after attention's output projection and after the "
              "MLP's down-projection", "d": "one per matrix (four)"}, "c",
             "Column-parallel QKV / up-projection need no communication; each row-parallel matrix ends in partial sums."),
    Question("With tensor parallelism over p ranks, what does each rank's KV cache hold?",
             {"a": "all heads, replicated", "b": "only its own H/p heads", "c": "only its own layers",
              "d": "nothing: K and V are all-reduced every step"}, "b",
             "The QKV projection is split by heads, so each rank computes and keeps K, V of its heads only."),
    Question("Pipeline with p = 4 equal stages and m = 4 micro-batches: what bubble does GPipe's formula give?",
             {"a": "0", "b": "3/7 ≈ 0.43", "c": "1/4", "d": "3/4"}, "b", "(p − 1)/(m + p − 1) = 3/7."),
    Question("Why is tensor parallelism usually kept inside one node and pipeline parallelism used across nodes?",
             {"a": "TP talks at every layer and needs NVLink-class bandwidth; PP only sends one activation per stage "
              "boundary", "b": "PP needs more memory", "c": "TP cannot run on more than 8 GPUs",
              "d": "InfiniBand has lower latency than NVLink"}, "a",
             "Two all-reduces per layer on a 50 GB/s link cost more than they save; a stage boundary is one hop."),
    Question("A top-2 MoE layer with experts spread evenly over 4 ranks, routing uniform: which share of the token "
             "copies leaves its rank in the dispatch all-to-all?",
             {"a": "1/4", "b": "1/2", "c": "3/4", "d": "all of them"}, "c", "(p − 1)/p = 3/4 of the copies."),
]


def check_answers(answers: dict[int, str]) -> tuple[int, list[str]]:
    """Grade ``{question number (1-based): letter}`` → ``(score, one feedback line per question)``.

    Raises:
        TypeError: ``answers`` not a dict.
    """
    if not isinstance(answers, dict):
        raise TypeError(f"answers must be a dict {{question number: letter}}, got {type(answers).__name__}")
    score, lines = 0, []
    for i, q in enumerate(QUESTIONS, start=1):
        given = answers.get(i)
        if given is None:
            lines.append(f"Q{i}: not answered")
        elif str(given).strip().lower() == q.answer:
            score += 1
            lines.append(f"Q{i}: ✓ {q.why}")
        else:
            lines.append(f"Q{i}: ✗ ({given!r}) — think again: {q.text}")
    return score, lines


def format_quiz() -> str:
    """All questions with their lettered choices, as plain text."""
    out = []
    for i, q in enumerate(QUESTIONS, start=1):
        out.append(f"Q{i}. {q.text}")
        out.extend(f"    {k}) {v}" for k, v in q.choices.items())
    return "\n".join(out)
