// Server load benchmark: the same greedy streaming completions run by one client (one
// request after the other) and by N concurrent clients, against one `llmopt serve`.
// Throughput = completion tokens / wall seconds. Also prints the CPU seconds the server
// and this load generator used, so a client-bound measurement shows itself.
//
//   node bench/server_load.mjs path/to/llmopt [--clients 32] [--tokens 64] [--rounds 3]
//                              [--raw] [--only-many] [--min-speedup X] [--model FILE]
//                              [--port P --pid PID] [-- extra serve args]
//
// Each round runs the one-client pass, then the N-client pass, so both see the same
// machine load; outputs (greedy) must be equal. --min-speedup: exit 1 when the median
// round's ratio is below X.
// --raw: a minimal HTTP/SSE client (node:http, counting `data:` events) instead of the
// official `openai` client, to see what the client library itself costs.
import { readFileSync, readdirSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { spawnServe } from '../tests/server/spawn_serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const dd = argv.indexOf('--');
const extra = dd >= 0 ? argv.splice(dd).slice(1) : [];
const opt = (name, def) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : def;
};
const LLMOPT = path.resolve(argv[0] || 'build/llmopt');
const N = Number(opt('--clients', 32));
const TOKENS = Number(opt('--tokens', 64));
const ROUNDS = Number(opt('--rounds', 3));
const RAW = argv.includes('--raw');
const ONLY_MANY = argv.includes('--only-many'); // skip the one-client runs (for profiling)
const MIN_SPEEDUP = Number(opt('--min-speedup', 0));
const MODEL = path.resolve(opt('--model', path.join(here, '../../shared/models/stories260K/stories260K-F32.gguf')));
const MODEL_ID = path.basename(MODEL).replace(/\.gguf$/, '');

function startServer() {
  return spawnServe(LLMOPT, [MODEL, '--port', '0', '--parallel', String(N), '--ctx', '256', ...extra]);
}

// CPU seconds (user + system) of a process, from /proc (clock ticks of 1/100 s).
function cpuSeconds(pid) {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const v = f.slice(f.lastIndexOf(')') + 2).split(' ');
  return (Number(v[11]) + Number(v[12])) / 100;
}

// The scheduler's counters (llmopt_scheduler_*) from GET /metrics.
async function schedCounters(port) {
  const t = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const v = {};
  for (const m of t.matchAll(/^llmopt_scheduler_(\w+?)(?:_total)?(?:\{phase="(\w+)"\})? ([0-9.e+-]+)$/gm))
    v[m[2] || m[1]] = Number(m[3]);
  return v;
}

// Per thread group of the server: CPU seconds and involuntary context switches (the
// scheduler thread "llmopt-sched", the HTTP threads "MHD-*", the rest).
function threadStats(pid) {
  const out = { sched: { cpu: 0, preempt: 0 }, http: { cpu: 0, preempt: 0 }, other: { cpu: 0, preempt: 0 } };
  let tids = [];
  try { tids = readdirSync(`/proc/${pid}/task`); } catch { return out; }
  for (const tid of tids) {
    try {
      const comm = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'utf8').trim();
      const st = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const v = st.slice(st.lastIndexOf(')') + 2).split(' ');
      const sw = readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8').match(/nonvoluntary_ctxt_switches:\s+(\d+)/);
      const g = comm === 'llmopt-sched' ? out.sched : comm.startsWith('MHD') ? out.http : out.other;
      g.cpu += (Number(v[11]) + Number(v[12])) / 100;
      g.preempt += sw ? Number(sw[1]) : 0;
    } catch { /* the thread ended */ }
  }
  return out;
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });

// One streamed completion with node:http; returns { text, tokens }.
function rawStream(port, prompt) {
  const body = JSON.stringify({ model: MODEL_ID, prompt, max_tokens: TOKENS, temperature: 0, stream: true,
                                stream_options: { include_usage: true } });
  return new Promise((resolve, reject) => {
    const rq = http.request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', agent,
                              headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } },
    (res) => {
      let buf = '', text = '', tokens = 0;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        let at;
        while ((at = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, at);
          buf = buf.slice(at + 2);
          if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
          const j = JSON.parse(ev.slice(6));
          if (j.usage) tokens = j.usage.completion_tokens;
          for (const c of j.choices) text += c.text;
        }
      });
      res.on('end', () => resolve({ text, tokens }));
      res.on('error', reject);
    });
    rq.on('error', reject);
    rq.end(body);
  });
}

async function main() {
  // --port P: use a server already listening on 127.0.0.1:P (started with --parallel >= N).
  const srv = opt('--port') ? { port: Number(opt('--port')), pid: Number(opt('--pid')), kill() {} } : await startServer();
  let run;
  if (RAW) {
    run = (p) => rawStream(srv.port, p);
  } else {
    const require = createRequire(path.join(here, '../tests/server/package.json'));
    const OpenAI = require('openai').default ?? require('openai');
    const c = new OpenAI({ baseURL: `http://127.0.0.1:${srv.port}/v1`, apiKey: 'none', maxRetries: 0 });
    run = async (p) => {
      const stream = await c.completions.create({ model: MODEL_ID, prompt: p, max_tokens: TOKENS, temperature: 0,
                                                   stream: true, stream_options: { include_usage: true } });
      let text = '', tokens = 0;
      for await (const ch of stream) {
        if (ch.usage) tokens = ch.usage.completion_tokens;
        for (const choice of ch.choices) text += choice.text;
      }
      return { text, tokens };
    };
  }
  const words = ['Lily', 'Tom', 'the dog', 'a bird', 'Ben', 'the sun', 'Mom', 'a fish'];
  const prompts = Array.from({ length: N }, (_, i) => `Once upon a time, ${words[i % 8]} ${['saw', 'had', 'wanted', 'found'][i % 4]} ${i}`);
  await run(prompts[0]); // warm-up

  const measure = async (concurrent) => {
    const m0 = await schedCounters(srv.port);
    const s0 = cpuSeconds(srv.pid), th0 = threadStats(srv.pid), c0 = process.cpuUsage(), t0 = performance.now();
    let rs;
    if (concurrent) {
      rs = await Promise.all(prompts.map((p) => run(p)));
    } else {
      rs = [];
      for (const p of prompts) rs.push(await run(p));
    }
    const secs = (performance.now() - t0) / 1000;
    const c1 = process.cpuUsage(c0);
    const server_cpu = cpuSeconds(srv.pid) - s0, th1 = threadStats(srv.pid);
    // HTTP threads of closed connections leave the task list: their CPU is what is left.
    const sched_cpu = th1.sched.cpu - th0.sched.cpu, sched_preempt = th1.sched.preempt - th0.sched.preempt;
    const m1 = await schedCounters(srv.port);
    const d = Object.fromEntries(Object.keys(m1).map((k) => [k, m1[k] - (m0[k] ?? 0)]));
    const tokens = rs.reduce((a, r) => a + r.tokens, 0);
    return { tps: tokens / secs, secs, tokens, texts: rs.map((r) => r.text), sched: d,
             server_cpu, sched_cpu, sched_preempt, client_cpu: (c1.user + c1.system) / 1e6 };
  };
  const fmt = (r) => {
    const d = r.sched, ms = (x) => (1000 * (x ?? 0)).toFixed(0);
    const steps = d.steps ? `\n      scheduler: ${d.steps} steps, ${(d.batch_tokens / d.steps).toFixed(1)} tokens/step; ` +
      `ms in batch ${ms(d.batch)}, forward ${ms(d.forward)} (${(1e6 * d.forward / d.steps).toFixed(0)} us/step), ` +
      `sample ${ms(d.sample)} (${(1e6 * d.sample / d.logit_rows).toFixed(1)} us/row), retire ${ms(d.retire)}, idle ${ms(d.idle)}` : '';
    const us = (x) => (1e6 * x / r.tokens).toFixed(0);
    return `${r.tps.toFixed(0)} tok/s (${r.tokens} tokens in ${r.secs.toFixed(2)} s)\n      CPU us/token: server ` +
           `${us(r.server_cpu)} (scheduler thread ${us(r.sched_cpu)}, the rest ${us(r.server_cpu - r.sched_cpu)}), ` +
           `load client ${us(r.client_cpu)}; scheduler preempted ${r.sched_preempt} times${steps}`;
  };
  let same = true;
  const ratios = [];
  for (let round = 0; round < ROUNDS; round++) {
    const one = ONLY_MANY ? { tps: 1, texts: [] } : await measure(false);
    const many = await measure(true);
    same &&= ONLY_MANY || many.texts.every((t, i) => t === one.texts[i]);
    ratios.push(many.tps / one.tps);
    if (!ONLY_MANY) console.log(`round ${round + 1}: 1 client ${fmt(one)}`);
    console.log(`round ${round + 1}: ${N} clients ${fmt(many)}`);
    console.log(`round ${round + 1}: ratio ${(many.tps / one.tps).toFixed(2)}x; load average ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`);
  }
  const median = [...ratios].sort((a, b) => a - b)[Math.floor(ratios.length / 2)];
  console.log(`outputs ${N} clients == 1 client: ${same ? 'yes' : 'NO'}`);
  console.log(`ratio per round: ${ratios.map((r) => r.toFixed(2)).join(' ')}; median ${median.toFixed(2)}x` +
              (MIN_SPEEDUP > 0 ? ` (goal >= ${MIN_SPEEDUP}x: ${median >= MIN_SPEEDUP ? 'met' : 'NOT met'})` : ''));
  srv.kill('SIGTERM');
  agent.destroy();
  if (!same || (MIN_SPEEDUP > 0 && median < MIN_SPEEDUP)) process.exitCode = 1;
}

main().catch((e) => { console.error(e); process.exit(1); });
