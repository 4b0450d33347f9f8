"""Quizzes and exercise checks: right/wrong verdicts, messages, and never raising for student input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from labsupport import kv
from labsupport.exercises import check_answer, check_function
from labsupport.quiz import MultipleChoice, Numeric, Quiz
from labsupport.widgets.quiz import quiz_panel


def test_numeric_question_tolerance_and_bad_input():
    q = Numeric("KiB per token?", answer=320.0, explanation="2·80·8·128·2 B", rel_tol=0.01, unit="KiB")
    assert q.check(320) == (True, "2·80·8·128·2 B")
    assert q.check("321.5")[0] and not q.check(330)[0]
    ok, why = q.check(400)
    assert not ok and "too high" in why and "320" not in why          # never gives the answer away
    for bad in ("lots", None, float("nan"), True, [320]):
        ok, why = q.check(bad)
        assert not ok and "number" in why


def test_multiple_choice_by_index_or_text_and_why_not():
    q = MultipleChoice("top-p keeps?", ["the k best", "the smallest set with mass ≥ p"], 1, "nucleus",
                       why_not={0: "that is top-k"})
    assert q.check(1) == (True, "nucleus")
    assert q.check("the smallest set with mass ≥ p")[0]
    assert q.check(0) == (False, "that is top-k")
    assert not q.check(5)[0] and not q.check("x")[0]


def test_questions_validate_their_definition():
    with pytest.raises(ValueError, match="answer"):
        MultipleChoice("q", ["a", "b"], 2, "e")
    with pytest.raises(ValueError, match="options"):
        MultipleChoice("q", ["a"], 0, "e")
    with pytest.raises(TypeError, match="answer"):
        Numeric("q", answer="3", explanation="e")
    with pytest.raises(ValueError, match="tolerance"):
        Numeric("q", answer=3.0, explanation="e", rel_tol=0.0)
    with pytest.raises(ValueError):
        Quiz([])


def test_quiz_report_counts_score():
    quiz = Quiz([Numeric("2+2", 4.0, "four"), MultipleChoice("pick b", ["a", "b"], 1, "b it is")])
    text = quiz.report([4, 0])
    assert "Q1 ✓ four" in text and "Q2 ✗" in text and text.endswith("score: 1 / 2")
    assert "not answered" in quiz.report([None])


def test_quiz_panel_shows_feedback_and_never_throws():
    bytes_70b = kv.kv_bytes_per_token(kv.preset("Llama 3 70B"), "bf16") / 1024
    panel = quiz_panel([Numeric("KiB per token", bytes_70b, "GQA: 8 KV heads"),
                        MultipleChoice("pick b", ["a", "b"], 1, "b it is")])
    assert panel.submit(0, str(bytes_70b)) == (True, "GQA: 8 KV heads")
    assert "✓" in panel.feedback[0].value
    assert panel.submit(1, 0)[0] is False and "✗" in panel.feedback[1].value
    ok, _ = panel.submit(7, 1)                                          # no such question: shown, not raised
    assert not ok
    assert "text/html" in panel._repr_mimebundle_()                    # static snapshot for exported slides


def test_check_function_reports_stub_error_mismatch_and_pass(capsys):
    ref = lambda x, k: torch.topk(x, k).indices.tolist()
    cases = [(torch.tensor([1.0, 3.0, 2.0]), 1), (torch.tensor([5.0, 4.0]), 2)]

    def stub(x, k):
        raise NotImplementedError

    r = check_function(stub, cases, ref, name="my_top")
    assert not r and not r.done and "not implemented" in r.message
    r = check_function(lambda x, k: 1 / 0, cases, ref, name="my_top")
    assert not r and "ZeroDivisionError" in r.message
    r = check_function(lambda x, k: [0] * k, cases, ref, name="my_top")
    assert not r and "returned [0], expected [1]" in r.message
    r = check_function(ref, cases, ref, name="my_top")
    assert r and "all 2 cases" in r.message
    assert capsys.readouterr().out.count("\n") == 4                    # one printed line per check


def test_check_answer_none_wrong_right_and_threshold():
    alpha_star = math.log(4.9 / 2.4) / math.log(7 / 3)                  # B wins only from α* = 0.8424…
    smallest = math.ceil(alpha_star * 100) / 100
    wins = lambda a: -4.9 / 7 ** a > -2.4 / 3 ** a
    accept = lambda a: wins(a) and not wins(a - 0.01)
    assert not check_answer(None, name="my_alpha", accept=accept).done
    assert not check_answer(0.84, name="my_alpha", accept=accept, explain=lambda a: "A still wins")
    assert check_answer(smallest, name="my_alpha", accept=accept)
    r = check_answer("abc", name="x", expected=1.0, rel_tol=0.1)
    assert not r and r.done and "cannot be checked" in r.message
    r = check_answer(3.0, name="my_T", expected=0.8686, rel_tol=0.01)
    assert not r and "0.8686" not in r.message


def test_panel_snapshot_shows_figures_readouts_and_skips_hidden_parts():
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from labsupport.widgets.snapshot import Panel

    hidden = widgets.FloatSlider(value=3.0, description="secret")
    hidden.layout.display = "none"
    out = widgets.Output()
    out.outputs = ({"output_type": "display_data", "data": {"application/vnd.plotly.v1+json":
                    go.Figure(go.Bar(y=[1, 2])).to_plotly_json(), "text/plain": "fig"}, "metadata": {}},)
    panel = Panel([widgets.FloatSlider(value=0.25, description="top-p"), hidden, widgets.HTML("<b>H = 1.00 bits</b>"),
                   go.FigureWidget(go.Scatter(y=[3, 1])), out])
    html = panel._repr_mimebundle_()["text/html"]
    assert "top-p = <b>0.25</b>" in html and "H = 1.00 bits" in html
    assert "secret" not in html
    assert html.count("Plotly.newPlot") == 2                       # the figure widget and the Output's figure
    assert "application/vnd.jupyter.widget-view+json" in panel._repr_mimebundle_()   # still the live widget


def test_run_check_reports_instead_of_raising():
    from labsupport.exercises import run_check

    def check(fn) -> int:
        for x in range(3):
            assert fn(x) == x * x, f"x = {x}: got {fn(x)}, expected {x * x}"
        return 3

    def stub(x):
        raise NotImplementedError

    assert not run_check(check, stub).done
    r = run_check(check, lambda x: x + x, name="my_square", quiet=True)
    assert not r and "x = 1: got 2, expected 1" in r.message      # x = 0 passes, x = 1 is the first failure
    r = run_check(check, lambda x: x / 0, name="my_square", quiet=True)
    assert not r and "ZeroDivisionError" in r.message
    assert run_check(check, lambda x: x * x, name="my_square", quiet=True).message == \
        "✓ my_square agrees with the reference on 3 cases"


def test_every_chapter_ends_with_a_labsupport_quiz_and_a_checked_score():
    """One quiz mechanism: a hidden ``quiz`` cell building ``Quiz`` + ``quiz_panel``, then a hidden answer key that
    asserts every keyed answer and prints nothing (a student's own score is the only one on the page)."""
    import re
    from pathlib import Path

    import nbformat

    chapters = sorted((Path(__file__).resolve().parent.parent / "chapters").glob("[0-9][0-9]_*.ipynb"))
    assert len(chapters) >= 10
    for path in chapters:
        cells = nbformat.read(path, as_version=4).cells
        code = "\n".join(c.source for c in cells if c.cell_type == "code")
        assert "hashlib" not in code and "labsupport.parallel.quiz" not in code, path.name
        quiz = [i for i, c in enumerate(cells) if "quiz" in c.metadata.get("tags", [])]
        assert len(quiz) == 1, f"{path.name}: {len(quiz)} cells tagged quiz"
        cell = cells[quiz[0]]
        assert "Quiz(" in cell.source and "quiz_panel(" in cell.source, path.name
        assert cell.metadata.get("jupyter", {}).get("source_hidden"), f"{path.name}: the quiz's code shows the answers"
        score = cells[quiz[0] + 1]           # the answer key: every keyed answer checks right, silently
        assert re.search(r"^assert all\(q\.check\(q\.answer\)\[0\] for q in quiz\d\d\.questions\)$", score.source,
                         flags=re.M), path.name
        assert not score.outputs and "solution" in score.metadata.get("tags", []), path.name
        count = cell.source.count("MultipleChoice(") + cell.source.count("Numeric(")
        assert 4 <= count <= 6, f"{path.name}: {count} questions"
        # exercises report through labsupport.exercises, not a bare try/except around the stub
        assert "except NotImplementedError" not in code, path.name
        assert "labsupport.exercises import" in code, path.name


PREDICT_THEN_CHECK = {"chapters": "Predict, then check:", "chapters-ko": "예측한 뒤 확인해 보세요:"}


@pytest.mark.parametrize("edition", sorted(PREDICT_THEN_CHECK))
def test_every_quiz_asks_a_prediction_that_the_run_answers(edition):
    """Each chapter's quiz has a predict-then-check question (#49): its prompt says so, and its ``answer`` is an
    expression evaluated in the run (a name or a call), not a number or option index typed into the notebook."""
    import ast
    from pathlib import Path

    import nbformat

    folder = Path(__file__).resolve().parent.parent / edition
    chapters = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    assert len(chapters) >= 10
    for path in chapters:
        cell = next(c for c in nbformat.read(path, as_version=4).cells if "quiz" in c.metadata.get("tags", []))
        found = []
        for node in ast.walk(ast.parse(cell.source)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("MultipleChoice", "Numeric")):
                continue
            prompt = node.args[0]
            text = prompt.value if isinstance(prompt, ast.Constant) else "".join(
                v.value for v in getattr(prompt, "values", []) if isinstance(v, ast.Constant))
            if not text.startswith(PREDICT_THEN_CHECK[edition]):
                continue
            answer = next(k.value for k in node.keywords if k.arg == "answer")
            found.append(any(isinstance(n, (ast.Name, ast.Call)) for n in ast.walk(answer)))
        assert found, f"{edition}/{path.name}: no question starts with {PREDICT_THEN_CHECK[edition]!r}"
        assert any(found), f"{edition}/{path.name}: the predict-then-check answer is typed in, not computed"


@pytest.mark.parametrize("edition", sorted(PREDICT_THEN_CHECK))
def test_the_right_option_is_rarely_the_longest(edition):
    """A new student found the right answer was usually the longest option (20 of 24 questions): a careful, qualified
    right answer next to short throw-away distractors. The distractors now argue as long as it does; at most a quarter
    of the multiple-choice questions (written options, three or more) may still have the right one strictly longest."""
    import ast
    from pathlib import Path

    import nbformat

    folder = Path(__file__).resolve().parent.parent / edition
    asked, longest = 0, []
    for path in sorted(folder.glob("[0-9][0-9]_*.ipynb")):
        cell = next(c for c in nbformat.read(path, as_version=4).cells if "quiz" in c.metadata.get("tags", []))
        for node in ast.walk(ast.parse(cell.source)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "MultipleChoice"):
                continue
            answer = next(k.value for k in node.keywords if k.arg == "answer")
            if not (isinstance(node.args[1], ast.List) and isinstance(answer, ast.Constant)):
                continue                                             # options or answer computed in the run
            options = [ast.literal_eval(e) for e in node.args[1].elts]
            if len(options) < 3:
                continue
            asked += 1
            others = [len(o) for i, o in enumerate(options) if i != answer.value]
            if len(options[answer.value]) > max(others):
                longest.append(f"{path.name}: {options[answer.value]!r}")
    assert asked >= 15
    assert len(longest) <= asked // 4, f"{len(longest)} of {asked} right answers are the longest option:\n" + \
        "\n".join(longest)


def test_exercise_result_as_a_cells_last_value_shows_nothing_more():
    """A check ending an exercise cell prints its line once; IPython must not add the result's repr."""
    from IPython.core.formatters import DisplayFormatter

    from labsupport.exercises import check_answer

    result = check_answer(None, name="my_x", accept=lambda x: x == 1)
    assert not result and not result.done
    data, _ = DisplayFormatter().format(result)
    assert data == {}, data


def test_predict_records_a_choice_and_the_measurement_decides():
    from labsupport.quiz import Predict
    from labsupport.widgets.quiz import predict_panel

    p = Predict("How much?", ["little", "some", "lots"])
    panel = predict_panel(p)
    assert "choose one of the options 0–2" in panel.submit(5) and p.choice is None     # a bad click is a message
    assert "noted" in panel.submit("some") and p.choice == 1
    text = p.reveal(2, "v = 3.1")
    assert text.startswith("✗") and "“lots”" in text and "you predicted “some”" in text
    assert "3.1" in panel.children[-1].value                                          # the panel shows the verdict
    assert panel.children[2].disabled and panel.children[3].value == ""               # locked, the "noted" line gone
    assert "stands" in panel.submit("lots") and p.choice == 1                         # no second guess after measuring
    assert p.reveal(1, "v = 1.2").startswith("✓")
    fresh = Predict("q", ["a", "b"])
    fresh_panel = predict_panel(fresh)
    shown = fresh.reveal(1, "m = 7")                                  # Run All: measured before any prediction
    assert "Pick your prediction" in shown and "7" not in shown and "“b”" not in shown
    assert fresh.verdict is None and fresh_panel.children[-1].value == "" and not fresh_panel.children[2].disabled
    assert "already made" in fresh_panel.submit("a")                  # the prediction reveals the verdict at once
    assert fresh.verdict.startswith("✗") and "m = 7" in fresh_panel.children[-1].value
    assert fresh_panel.children[2].disabled and "stands" in fresh_panel.submit("b")
    fresh = Predict("q", ["a", "b"])
    with pytest.raises(ValueError, match="answer"):
        fresh.reveal(2, "m")
    with pytest.raises(TypeError, match="measured"):
        fresh.reveal(0, 3.0)
    with pytest.raises(ValueError, match="at least 2"):
        Predict("q", ["only"])
    with pytest.raises(TypeError, match="prediction"):
        predict_panel("not a prediction")
    for bad in (5, None, {"a", "b"}):                                 # a set has no stable order
        with pytest.raises(TypeError, match="options"):
            Predict("q", bad)
    for bad in (["a", "a"], ["a", " "]):
        with pytest.raises(ValueError, match="distinct"):
            Predict("q", bad)
    again = Predict("q", ["a", "b"])
    assert "noted" in again.choose(np.int64(1)) and again.choice == 1                   # numpy ints are indices
    again.choose(0)
    assert again.choice == 0                                                            # before measuring: free to change
    again.reveal(0, "m")
    assert "stands" in again.choose(1) and again.choice == 0                             # after: the first one stands
    again._listeners.append(lambda ok, text: 1 / 0)                                     # a broken listener
    assert again.reveal(0, "m").startswith("✓")


def test_every_chapter_asks_two_predictions_before_measuring_and_one_transfer():
    """Issue 22: ≥ 2 predict-then-measure questions per chapter (a Predict panel, then a later cell that
    reveals it from the run), and ≥ 1 quiz question that transfers a result to other hardware or models."""
    import re
    from pathlib import Path

    import nbformat

    chapters = sorted((Path(__file__).resolve().parent.parent / "chapters").glob("[0-9][0-9]_*.ipynb"))
    for path in chapters:
        cells = nbformat.read(path, as_version=4).cells
        predicts = [(i, re.search(r"(\w+) = Predict\(", c.source).group(1)) for i, c in enumerate(cells)
                    if c.cell_type == "code" and "predict" in c.metadata.get("tags", [])]
        assert len(predicts) >= 2, f"{path.name}: {len(predicts)} predict cells"
        for i, var in predicts:
            assert "predict_panel(" in cells[i].source and cells[i].metadata["jupyter"]["source_hidden"], path.name
            later = [j for j, c in enumerate(cells) if j > i and f"{var}.reveal(" in c.source]
            assert later, f"{path.name}: {var} is never revealed by a measurement"
            assert "quiz" not in cells[later[0]].metadata.get("tags", []), f"{path.name}: {var} revealed by the quiz"
        quiz = next(c for c in cells if "quiz" in c.metadata.get("tags", []))
        assert re.search(r'(Numeric|MultipleChoice)\(f?"Transfer', quiz.source), f"{path.name}: no transfer question"


def test_every_chapter_says_where_its_techniques_stand_in_todays_engines():
    """Issue 22: a short, dated table per chapter (vLLM, SGLang, TensorRT-LLM, llama.cpp), with sources."""
    from pathlib import Path

    import nbformat

    for path in sorted((Path(__file__).resolve().parent.parent / "chapters").glob("[0-9][0-9]_*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        table = [c.source for c in cells if c.cell_type == "markdown" and c.source.startswith("### In today's engines")]
        assert len(table) == 1, path.name
        text = table[0]
        assert "| Technique | vLLM | SGLang | TensorRT-LLM | llama.cpp |" in text and "December 2026" in text, path.name
        rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| Technique")]
        assert 2 <= len(rows) <= 5 and all(line.count("|") == 6 for line in rows), path.name
        assert "Sources:" in text, path.name


def test_quiz_panels_place_the_right_answer_by_a_seeded_shuffle():
    """As written, most right answers were the second option; panels show the options in an order
    seeded by the prompt (the same on every run), so across the course the right answer's place is
    spread over the positions."""
    import ast
    from collections import Counter
    from pathlib import Path

    import nbformat

    from labsupport.quiz import MultipleChoice
    from labsupport.widgets.quiz import quiz_panel

    q = MultipleChoice("Which?", ["a", "bb", "ccc"], answer=1, explanation="e")
    assert sorted(q.display_order) == [0, 1, 2] and q.display_order == q.display_order
    buttons = quiz_panel([q]).children[2]
    assert [label for label, _ in buttons.options] == [q.options[k] for k in q.display_order]
    assert [value for _, value in buttons.options] == q.display_order            # a click still sends the index
    written, shown = Counter(), Counter()
    for path in sorted(Path(__file__).resolve().parent.parent.glob("chapters*/[0-9][0-9]_*.ipynb")):
        for cell in nbformat.read(path, 4).cells:
            if cell.cell_type != "code" or "MultipleChoice(" not in cell.source:
                continue
            for node in ast.walk(ast.parse(cell.source)):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "MultipleChoice":
                    prompt = node.args[0]
                    options = node.args[1]
                    answer = next(k.value for k in node.keywords if k.arg == "answer")
                    if not (isinstance(prompt, ast.Constant) and isinstance(options, ast.List)
                            and isinstance(answer, ast.Constant)):
                        continue
                    mc = MultipleChoice(prompt.value, ["x"] * len(options.elts), answer.value, "e")
                    written[answer.value] += 1
                    shown[mc.display_order.index(answer.value)] += 1
    total = sum(shown.values())
    assert total >= 40, total
    assert max(shown.values()) <= 0.5 * total, (written, shown)              # no place holds half the answers


def test_hidden_solution_cells_print_nothing_a_student_could_read_off():
    """A solution cell runs (its asserts show it passes) but keeps its output out of sight: %%capture, or the
    answer key's bare assert. Printing ``T = 2 / ln 10 = 0.8686`` under a collapsed input gave the answer away."""
    from pathlib import Path

    import nbformat

    root = Path(__file__).resolve().parent.parent
    for path in sorted(root.glob("chapters*/[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "code" and "solution" in cell.metadata.get("tags", []):
                silent = cell.source.startswith("%%capture\n") or (
                    "print(" not in cell.source and "display(" not in cell.source and cell.source.rstrip().split("\n")[-1].startswith("assert "))
                assert silent, f"{path.parent.name}/{path.name} cell {i} prints what it solves"
