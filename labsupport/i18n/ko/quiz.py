"""Korean messages of labsupport.quiz."""

MESSAGES = {
    "Quiz": "퀴즈",
    # multiple choice
    "choose one of the options 0–{last} (got {answer!r})": "보기 0–{last} 중 하나를 고르세요 (받은 값: {answer!r})",
    "not this one — think again about what the question asks": "이것이 아닙니다 — 질문이 무엇을 묻는지 다시 생각해 보세요",
    # numeric
    "give a number in {unit} (got {answer!r})": "{unit} 단위의 숫자를 입력하세요 (받은 값: {answer!r})",
    "give a number (got {answer!r})": "숫자를 입력하세요 (받은 값: {answer!r})",
    "give a finite number in {unit} (got {answer!r})": "{unit} 단위의 유한한 숫자를 입력하세요 (받은 값: {answer!r})",
    "give a finite number (got {answer!r})": "유한한 숫자를 입력하세요 (받은 값: {answer!r})",
    "{value:g} is too high.": "{value:g}: 너무 큽니다.",
    "{value:g} is too high. Hint: {hint}": "{value:g}: 너무 큽니다. 힌트: {hint}",
    "{value:g} is too low.": "{value:g}: 너무 작습니다.",
    "{value:g} is too low. Hint: {hint}": "{value:g}: 너무 작습니다. 힌트: {hint}",
    # predictions
    "the measurement is in: your prediction “{choice}” stands (see the verdict)":
        "측정이 끝났습니다: 처음 한 예측(“{choice}”)이 그대로 남습니다 (판정을 보세요)",
    "noted: “{choice}”. Now run the cells below: the measurement reveals the answer.":
        "기록했습니다: “{choice}”. 이제 아래 셀을 실행하세요. 측정이 답을 알려 줍니다.",
    "Measured. Pick your prediction in the panel above: its verdict appears there at once.":
        "측정했습니다. 위 패널에서 예측을 고르세요. 판정이 그 자리에 바로 나타납니다.",
    "noted: “{choice}”. The measurement was already made: the verdict is below.":
        "기록했습니다: “{choice}”. 측정은 이미 끝났습니다. 판정은 아래에 있습니다.",
    "Measured: {measured} → “{right}”, as you predicted.": "측정: {measured} → “{right}”, 예측한 대로입니다.",
    "Measured: {measured} → “{right}”; you predicted “{choice}”.": "측정: {measured} → “{right}”; 예측은 “{choice}”였습니다.",
    # report
    "Q{i} – not answered": "Q{i} – 답하지 않음",
    "score: {score} / {total}": "점수: {score} / {total}",
}
