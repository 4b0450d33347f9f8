"""Korean messages of labsupport.widgets.quiz."""

MESSAGES = {
    "a number in {unit}": "{unit} 단위 숫자",
    "a number": "숫자",
    "check": "확인",
    "{right} of {total} right ({answered} answered)": "{total}문제 중 {right}개 정답 ({answered}개 답함)",
    "Predict before you run the cells below": "아래 셀을 실행하기 전에 예측하세요",
}
