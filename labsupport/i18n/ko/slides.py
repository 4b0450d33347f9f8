"""Korean messages of ``labsupport.slides`` (the offline decks' own words)."""

MESSAGES = {
    "(a live panel: run this chapter in JupyterLab to use it)":
        "(라이브 패널: 이 장을 JupyterLab에서 실행하면 쓸 수 있습니다)",
    "▼ more below": "▼ 아래에 더 있음",
}
