import asyncio, time, httpx
from embedded_llm import EmbeddedLLM, EmbeddedLLMConfig
async def main():
    async with EmbeddedLLM(EmbeddedLLMConfig(threads=2, n_parallel=4)) as llm:
        root = llm.base_url[:-3]
        async with httpx.AsyncClient(timeout=600) as c:
            for extra in ({}, {}, {"top_k": 0, "top_p": 1.0, "min_p": 0.0}, {"top_k": 40}):
                t=time.time()
                r = await c.post(root+"/completion", json={"prompt": "Tell me a story about a cat.", "n_predict": 64, "temperature": 0.7, "n_probs": 1, "return_tokens": True, "ignore_eos": True, **extra})
                j=r.json(); print(extra, len(j["tokens"]), round(time.time()-t,2), j.get("timings",{}).get("predicted_per_second"))
asyncio.run(main())
