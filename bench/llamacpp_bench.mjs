// llama.cpp side of bench/compare.sh, through npm's node-llama-cpp (its prebuilt CPU
// build): prefill of P prompt tokens and greedy decode of N tokens, with T threads.
// Prints one JSON line: {"prefill_tok_s", "decode_tok_s", ...}.
// Usage: node llamacpp_bench.mjs MODEL.gguf P N T REPS
import {getLlama} from "node-llama-cpp";

const [modelPath, P, N, T, REPS] = [process.argv[2], +process.argv[3], +process.argv[4],
                                    +process.argv[5], +(process.argv[6] || 3)];
const llama = await getLlama({gpu: false, build: "never"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: P + N + 8, threads: T, batchSize: Math.min(P, 512)});
// a prompt of ordinary text tokens (the content does not change the cost)
let prompt = [];
const text = "Once upon a time, there was a little girl who loved to read stories about the sea. ";
while (prompt.length < P) prompt = prompt.concat(Array.from(model.tokenize(text)));
prompt = prompt.slice(0, P);
const median = (a) => a.slice().sort((x, y) => x - y)[Math.floor(a.length / 2)];
const pre = [], dec = [];
for (let r = 0; r <= REPS; r++) {  // r == 0 warms up
  const seq = context.getSequence();
  let t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(prompt);
  let t1 = performance.now();
  let n = 0;
  const t2 = performance.now();
  for await (const tok of seq.evaluate([prompt[P - 1]], {temperature: 0})) {
    if (++n >= N) break;
  }
  const t3 = performance.now();
  if (r > 0) { pre.push(P / ((t1 - t0) / 1000)); dec.push(n / ((t3 - t2) / 1000)); }
  seq.dispose();
}
console.log(JSON.stringify({engine: "llama.cpp (node-llama-cpp)", prefill_tok_s: median(pre), decode_tok_s: median(dec),
                            threads: T, n_prompt: P, n_gen: N, reps: REPS}));
await context.dispose(); await model.dispose();
