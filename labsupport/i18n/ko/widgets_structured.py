"""Korean messages of labsupport.widgets.structured."""

MESSAGES = {
    "output complete: EOS after {n} token — press reset to start again":
        "출력 완료: 토큰 {n}개 뒤 EOS — 다시 시작하려면 초기화를 누르세요",
    "output complete: EOS after {n} tokens — press reset to start again":
        "출력 완료: 토큰 {n}개 뒤 EOS — 다시 시작하려면 초기화를 누르세요",
    "No more candidates: the grammar's output is complete": "후보 없음: 문법에 맞는 출력이 끝났습니다",
    "valid JSON, matches the schema ✓": "유효한 JSON, 스키마와 일치 ✓",
    "does not parse yet ({error})": "아직 파싱되지 않음 ({error})",
    "parses, but {error}": "파싱되지만 스키마 위반: {error}",
    "matches ✓": "일치 ✓",
    "does not match": "일치하지 않음",
    "incomplete: a valid prefix — {reason}": "미완성: 유효한 접두사 — {reason}",
    "invalid — {reason}": "유효하지 않음 — {reason}",
    "grammar ON": "문법 켬",
    "grammar OFF": "문법 끔",
    "temperature T (0 = greedy)": "온도 T (0 = 그리디)",
    "seed": "시드",
    "sample next token": "다음 토큰 샘플링",
    "complete": "끝까지 생성",
    "sample up to {n} tokens, until EOS": "EOS가 나올 때까지 토큰을 최대 {n}개 샘플링",
    "undo": "되돌리기",
    "reset": "초기화",
    "after reset, e.g. {example}": "초기화 후, 예: {example}",
    "force text": "강제할 텍스트",
    "force this text": "이 텍스트 강제",
    "grammar state": "문법 상태",
    "left the grammar ✗": "문법을 벗어남 ✗",
    "{state} (accepting)": "{state} (수락 상태)",
    "allowed next tokens": "허용되는 다음 토큰",
    "{allowed:,} of {vocab:,}": "{vocab:,}개 중 {allowed:,}개",
    "mask look-up": "마스크 조회",
    "parse result": "파싱 결과",
    "refused by the grammar: token “{token}” (only {n:,} token is allowed here)":
        "문법이 거부했습니다: 토큰 “{token}” (여기서 허용되는 토큰은 {n:,}개뿐입니다)",
    "refused by the grammar: token “{token}” (only {n:,} tokens are allowed here)":
        "문법이 거부했습니다: 토큰 “{token}” (여기서 허용되는 토큰은 {n:,}개뿐입니다)",
    "the 1 token before it was added, it and the rest were not":
        "그 앞의 토큰 1개는 추가했고, 이 토큰과 나머지는 추가하지 않았습니다",
    "the {n} tokens before it were added, it and the rest were not":
        "그 앞의 토큰 {n}개는 추가했고, 이 토큰과 나머지는 추가하지 않았습니다",
    "nothing was added (forced text continues the output so far: press reset to start from the prompt)":
        "아무것도 추가하지 않았습니다 (강제한 텍스트는 지금까지의 출력에 이어 붙습니다: 프롬프트부터 "
        "시작하려면 초기화를 누르세요)",
    "nothing was added": "아무것도 추가하지 않았습니다",
    "<b>candidates</b> (press to force):": "<b>후보</b> (눌러서 강제):",
    " — {n} frames": " — 프레임 {n}개",
    " — 1 frame": " — 프레임 1개",
    " (+{n} more stacks)": " (스택 {n}개 더)",
    "stack (bottom › top)": "스택 (아래 › 위)",
}
