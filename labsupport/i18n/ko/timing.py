"""Korean messages of ``labsupport.timing`` (a median with its range and count)."""

MESSAGES = {
    "{median} ms ({low}–{high}, {n} runs)": "{median} ms ({low}–{high}, {n}회 실행)",
    "{median}{unit} (1 run)": "{median}{unit} (1회 실행)",
    "{median}{unit} ({low}–{high}, {n} runs)": "{median}{unit} ({low}–{high}, {n}회 실행)",
}
