"""Korean messages of labsupport.widgets.snapshot."""

MESSAGES = {
    "[{kind}: no snapshot ({error})]": "[{kind}: 스냅숏 없음 ({error})]",
}
