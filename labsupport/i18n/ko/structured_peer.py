"""Korean messages of ``labsupport.structured.peer`` (our compiler and XGrammar on the same schemas)."""

MESSAGES = {
    "enum filtered by type": "type으로 거른 enum",
    "allOf of two bounds": "두 범위의 allOf",
    "not a constant": "상수의 not",
    "overlapping oneOf": "겹치는 oneOf",
    "date on Feb 29 of 2023": "2023년 2월 29일 날짜",
    "multipleOf": "multipleOf",
    "exclusiveMaximum": "exclusiveMaximum",
    "anchored pattern": "앵커가 있는 pattern",
    "uniqueItems": "uniqueItems",
    "ACCEPTS the invalid instance": "잘못된 인스턴스를 받아들임",
    "rejects it": "거부함",
    "not installed": "설치되지 않음",
    "refuses the schema ({why})": "스키마 컴파일을 거절함 ({why})",
}
