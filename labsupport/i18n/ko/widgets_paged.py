"""Korean messages of labsupport.widgets.paged."""

MESSAGES = {
    "[{shown}, … ({n} blocks)]": "[{shown}, … (블록 {n}개)]",
    "request {rid}": "요청 {rid}",
    "no running request": "실행 중인 요청 없음",
    "Paged side, block tables of the first {first} running requests (step {step})":
        "페이지 할당 쪽: 실행 중인 요청 앞 {first}개의 블록 테이블 (스텝 {step})",
    "reservation": "예약 길이",
    "block size": "블록 크기",
    "arrivals/step": "도착/스텝",
    "step": "스텝",
    "play": "재생",
    "Block tables": "블록 테이블",
    "engine": "엔진",
}
