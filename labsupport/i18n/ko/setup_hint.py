"""Korean messages of labsupport.setup_hint (the NameError hint before the set-up cell)."""

MESSAGES = {
    "This name is defined by the chapter's set-up: run the first code cell of the chapter "
    "(at the top, under the title) — or Run ▸ Run All Cells — then this cell again.":
        "이 이름은 이 장의 설정 셀이 정의합니다. 장의 첫 코드 셀(맨 위, 제목 아래)을 실행하거나 "
        "Run ▸ Run All Cells로 모든 셀을 실행한 뒤, 이 셀을 다시 실행하세요.",
}
