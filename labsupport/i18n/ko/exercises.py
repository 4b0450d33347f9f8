"""Korean messages of labsupport.exercises (the lines an exercise check prints)."""

MESSAGES = {
    "your function": "여러분의 함수",
    "the reference": "기준 구현",
    # check_function
    "{label} is not implemented yet — fill in the stub and run the check again":
        "{label}: 아직 구현되지 않았습니다 — 스텁을 채우고 검사를 다시 실행하세요",
    "{label}({args}) raised {error}: {message}": "{label}({args})에서 {error} 발생: {message}",
    "{label}({args}) returned {got}, expected {want}": "{label}({args}) 반환값 {got}, 기대값 {want}",
    "{label} agrees with the reference on all {count} cases": "{label}: 사례 {count}개 모두 기준 구현과 일치합니다",
    # check_answer
    "set {name} to your answer and run this cell again": "{name}에 답을 넣고 이 셀을 다시 실행하세요",
    "{name} = {value} cannot be checked: {error}: {message}": "{name} = {value}: 확인할 수 없습니다: {error}: {message}",
    "right": "정답",
    "not quite — check your working": "아직 아닙니다 — 풀이를 다시 확인하세요",
    "not quite ({error}: {message})": "아직 아닙니다 ({error}: {message})",
    # run_check
    "{label} is not implemented yet — write it where it says YOUR CODE HERE, then run the cells from there to this one again":
        "{label}: 아직 구현되지 않았습니다 — '여기에 코드를 작성하세요' 자리에 작성한 뒤, 그 셀부터 이 셀까지 다시 실행하세요",
    "a case failed (the check gave no detail)": "사례 하나가 실패했습니다 (검사가 자세한 내용을 알려 주지 않았습니다)",
    "{label} disagrees with {against}: {detail}": "{label}: 불일치 (비교 대상: {against}): {detail}",
    "{label} raised {error}: {message}": "{label}에서 {error} 발생: {message}",
    "{label} agrees with {against} on {cases} cases": "{label}: 사례 {cases}개 모두 일치합니다 (비교 대상: {against})",
}
