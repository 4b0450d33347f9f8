"""Korean messages of labsupport.widgets.speculative_variants."""

MESSAGES = {
    "Medusa heads": "메두사 헤드",
    "self-speculation": "자기 투기",
    "lookahead": "룩어헤드",
    "chain (1, 1, 1)": "체인 (1, 1, 1)",
    "method": "방법",
    "tree (top-k per depth)": "트리 (깊이별 top-k)",
    "γ / window": "γ / 윈도",
    "draft layers k": "초안 층 수 k",
    "temperature": "온도",
    "round shown": "표시할 라운드",
    "Round {i}: {candidates} candidates, {accepted} accepted": "라운드 {i}: 후보 {candidates}개, 수락 {accepted}개",
    "γ is the tree's depth under Medusa (set by the tree shape)": "메두사에서 γ는 트리의 깊이입니다 (트리 모양이 정합니다)",
    "at T > 0 Medusa drafts one chain from its heads (a tree is verified greedily only)":
        "T > 0에서 메두사는 헤드로 체인 하나를 초안으로 만듭니다 (트리는 그리디로만 검증합니다)",
    "γ is the Jacobi window under lookahead": "룩어헤드에서 γ는 자코비 윈도입니다",
    "tokens / target forward": "토큰 / 타깃 순전파",
    "α at depth 1": "깊이 1의 α",
    "nodes verified / round": "검증한 노드 / 라운드",
    "target forwards": "타깃 순전파 횟수",
    "{forwards} for {tokens} tokens": "토큰 {tokens}개에 {forwards}회",
}
