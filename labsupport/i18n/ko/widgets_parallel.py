"""Korean messages of labsupport.widgets.parallel."""

MESSAGES = {
    "micro-batches m": "마이크로배치 m",
    "{p} stages, m = {m} micro-batches": "스테이지 {p}개, 마이크로배치 m = {m}",
    "measured bubble <b>{bubble:.2f}</b> · GPipe's (p − 1)/(m + p − 1) = {gpipe:.2f}":
        "측정한 버블 <b>{bubble:.2f}</b> · GPipe의 (p − 1)/(m + p − 1) = {gpipe:.2f}",
    "model": "모델",
    "TP link": "TP 링크",
    "TP degree": "TP 차수",
    "PP degree": "PP 차수",
    "batch": "배치",
    "context": "컨텍스트",
    "ValueError: PP degree {pp} needs at least {pp} layers; {model} has {layers}: "
    "choose a PP degree of at most {layers}":
        "PP 차수 {pp}에는 층이 {pp}개 이상 필요하지만 {model}의 층은 {layers}개입니다: "
        "PP 차수를 {layers} 이하로 고르세요",
    "ValueError: TP degree {tp} does not divide the {heads} heads of {model}":
        "{model}의 헤드 {heads}개는 TP 차수 {tp}의 배수가 아닙니다",
    "{model} on {gpu}, PP {pp}, batch {batch}, context {context:,}":
        "{gpu}에서 {model}, PP {pp}, 배치 {batch}, 컨텍스트 {context:,}",
    "{gpus} GPU(s): step <b>{step:.2f} ms</b> (weights {weights:.2f}, KV {kv:.2f}, TP all-reduce "
    "{tp_comm:.2f} on {tp_link}, PP hops {pp_comm:.3f} on {pp_link}) · memory per GPU {memory:.1f} GB — "
    "{fits} · fastest layout that fits at this PP: {best}":
        "GPU {gpus}개: 스텝 <b>{step:.2f} ms</b> (가중치 {weights:.2f}, KV {kv:.2f}, TP 올리듀스 "
        "{tp_comm:.2f}({tp_link}), PP 홉 {pp_comm:.3f}({pp_link})) · GPU당 메모리 {memory:.1f} GB — "
        "{fits} · 이 PP에서 메모리에 들어가는 가장 빠른 구성: {best}",
    "fits": "메모리에 들어감",
    "<b>does not fit</b>": "<b>메모리에 들어가지 않음</b>",
    "none": "없음",
}
