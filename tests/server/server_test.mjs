// Drives a live `llmopt serve` on 127.0.0.1 with the official OpenAI client (npm
// `openai`): chat and completions, streaming and not, stop sequences, seeds, usage
// against the tokenizer, logprobs, auth, bad input, metrics, client disconnects, and a
// bounded load test (32 concurrent streaming clients vs one client).
//
//   node tests/server/server_test.mjs path/to/llmopt [--quick]
//
// Prints one line per check and "N passed, N failed" last; exits non-zero on failure.
// Every server it starts is killed at the end, also on failure or timeout.
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { spawnServe } from './spawn_serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const LLMOPT = path.resolve(process.argv[2] || 'build/llmopt');
const QUICK = process.argv.includes('--quick');
const MODEL = path.resolve(here, '../../../shared/models/stories260K/stories260K-F32.gguf');
const MODEL_ID = 'stories260K-F32';
const TEMPLATE = path.join(here, 'chatml.jinja');
const TOTAL_TIMEOUT_MS = 420_000;
// Throughput with 32 clients over one client (the issue asks for 4x) is a performance
// goal, so it is measured and printed here, and asserted only when
// LLMOPT_SERVER_MIN_SPEEDUP is set (the benchmark does: bench/server.sh).
const MIN_SPEEDUP = Number(process.env.LLMOPT_SERVER_MIN_SPEEDUP || 0);

let passed = 0, failed = 0;
function check(name, cond, detail) {
  if (cond) { passed++; console.log(`ok   ${name}`); }
  else { failed++; console.log(`FAIL ${name}${detail !== undefined ? ': ' + detail : ''}`); }
}

// ---- servers ----
const servers = new Set();

function startServer(extra = []) {
  // Under AddressSanitizer, freed memory waits in a quarantine that would read as RSS
  // growth; a small one keeps the RSS check meaningful (ignored by other builds).
  const asan = [process.env.ASAN_OPTIONS, 'quarantine_size_mb=2', 'thread_local_quarantine_size_kb=64']
    .filter(Boolean).join(':');
  return spawnServe(LLMOPT, [MODEL, '--port', '0', '--chat-template', TEMPLATE, ...extra], {
    env: { ...process.env, ASAN_OPTIONS: asan },
    onSpawn: (proc) => {
      servers.add(proc);
      proc.on('exit', () => servers.delete(proc));
    },
  });
}

function stopServer(proc) {
  return new Promise((resolve) => {
    if (proc.exited) return resolve(proc.exited);
    const t = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    proc.once('exit', (code, sig) => { clearTimeout(t); resolve({ code, sig }); });
    proc.kill('SIGTERM');
  });
}

function killAll() { for (const p of servers) { try { p.kill('SIGKILL'); } catch { /* gone */ } } }
process.on('exit', killAll);
const guard = setTimeout(() => {
  console.log(`FAIL the test ran over ${TOTAL_TIMEOUT_MS / 1000} s`);
  killAll();
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
}, TOTAL_TIMEOUT_MS);

const base = (srv) => `http://127.0.0.1:${srv.port}`;
const client = (srv, apiKey = 'none') =>
  new OpenAI({ baseURL: base(srv) + '/v1', apiKey, maxRetries: 0, timeout: 60_000 });

async function rawPost(srv, p, body, headers = {}) {
  const r = await fetch(base(srv) + p, {
    method: 'POST', body, headers: { 'Content-Type': 'application/json', ...headers },
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, json };
}

async function metrics(srv) {
  const t = await (await fetch(base(srv) + '/metrics')).text();
  const get = (name) => {
    const m = t.match(new RegExp('^' + name.replace(/[{}"=/.]/g, (c) => '\\' + c) + ' ([0-9.e+-]+)$', 'm'));
    return m ? Number(m[1]) : undefined;
  };
  return { text: t, get };
}

async function healthy(srv) {
  try { return (await fetch(base(srv) + '/health')).status === 200; } catch { return false; }
}

function tokenCount(text) {
  const out = execFileSync(LLMOPT, ['tokenize', MODEL, text]).toString().trim();
  return out ? out.split(/\s+/).length : 0;
}

const chatml = (messages) =>
  messages.map((m) => `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`).join('') + '<|im_start|>assistant\n';

async function streamCompletion(c, params) {
  const t0 = performance.now();
  const stream = await c.completions.create({ ...params, stream: true });
  let text = '', finish = null, chunks = 0, usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      text += choice.text;
      chunks++;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return { text, finish, chunks, usage, ms: performance.now() - t0 };
}

async function streamChat(c, params) {
  const stream = await c.chat.completions.create({ ...params, stream: true });
  let text = '', finish = null, role = null, usage = null, id = null, object = null;
  const logprobs = [];
  for await (const ch of stream) {
    id = ch.id; object = ch.object;
    if (ch.usage) usage = ch.usage;
    for (const choice of ch.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) text += choice.delta.content;
      if (choice.logprobs?.content) logprobs.push(...choice.logprobs.content);
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return { text, finish, role, usage, id, object, logprobs };
}

// ---- the checks ----

async function basics(srv) {
  const c = client(srv);
  const h = await fetch(base(srv) + '/health');
  check('/health answers 200 ok', h.status === 200 && (await h.json()).status === 'ok');
  const models = await c.models.list();
  check('/v1/models lists the model', models.data.length === 1 && models.data[0].id === MODEL_ID,
        JSON.stringify(models.data));

  // Completions, non-streamed, greedy.
  const prompt = 'Once upon a time';
  const r = await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 24, temperature: 0 });
  const choice = r.choices[0];
  check('completion: id, object, created', r.id.startsWith('cmpl-') && r.object === 'text_completion' &&
        Number.isInteger(r.created) && r.model === MODEL_ID, JSON.stringify(r).slice(0, 200));
  check('completion: text and finish_reason length', choice.text.length > 10 && choice.finish_reason === 'length',
        JSON.stringify(choice));
  check('completion: usage.prompt_tokens equals llmopt tokenize', r.usage.prompt_tokens === tokenCount(prompt),
        `${r.usage.prompt_tokens} vs ${tokenCount(prompt)}`);
  check('completion: usage.completion_tokens = max_tokens, total adds up',
        r.usage.completion_tokens === 24 && r.usage.total_tokens === r.usage.prompt_tokens + 24,
        JSON.stringify(r.usage));
  const ref = await rawPost(srv, '/v1/completions', JSON.stringify({ prompt, max_tokens: 24, temperature: 0 }));
  check('completion without "model" is served', ref.status === 200 && ref.json.choices[0].text === choice.text);

  // Streamed: the same text, usage at the end.
  const s = await streamCompletion(c, { model: MODEL_ID, prompt, max_tokens: 24, temperature: 0,
                                        stream_options: { include_usage: true } });
  check('completion stream: same text as non-stream (greedy)', s.text === choice.text, `${JSON.stringify(s.text)} vs ${JSON.stringify(choice.text)}`);
  check('completion stream: finish_reason length, several chunks', s.finish === 'length' && s.chunks > 5);
  check('completion stream: include_usage', s.usage && s.usage.completion_tokens === 24 &&
        s.usage.prompt_tokens === r.usage.prompt_tokens, JSON.stringify(s.usage));

  // Raw SSE shape.
  const raw = await rawPost(srv, '/v1/completions', JSON.stringify({ prompt, max_tokens: 3, temperature: 0, stream: true }));
  const events = raw.text.split('\n\n').filter(Boolean);
  check('SSE: data: lines ending with data: [DONE]', raw.status === 200 &&
        events.every((e) => e.startsWith('data: ')) && events[events.length - 1] === 'data: [DONE]', raw.text.slice(-200));

  // echo: the prompt, then the same completion; stop sequences see only the completion.
  const e1 = await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 24, temperature: 0, echo: true });
  check('completion echo: prompt + the same completion, usage unchanged', e1.choices[0].text === prompt + choice.text &&
        e1.usage.completion_tokens === 24 && e1.usage.prompt_tokens === r.usage.prompt_tokens, JSON.stringify(e1.choices[0].text));
  const es = await streamCompletion(c, { model: MODEL_ID, prompt, max_tokens: 24, temperature: 0, echo: true });
  check('completion echo stream: the same text, the prompt as one chunk first', es.text === prompt + choice.text &&
        es.chunks === s.chunks + 1, `${JSON.stringify(es.text)} (${es.chunks} vs ${s.chunks} chunks)`);
  const ids = execFileSync(LLMOPT, ['tokenize', MODEL, prompt]).toString().trim().split(/\s+/).map(Number);
  const eids = await c.completions.create({ model: MODEL_ID, prompt: ids, max_tokens: 24, temperature: 0, echo: true });
  check('completion echo of token ids: their text + the same completion', eids.choices[0].text === prompt + choice.text,
        JSON.stringify(eids.choices[0].text));
  const estop = await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 24, temperature: 0, echo: true,
                                             stop: ['upon'] });
  check('completion echo: a stop sequence in the prompt does not end the completion',
        estop.choices[0].text === prompt + choice.text, JSON.stringify(estop.choices[0].text));
  for (const [what, body, path] of [
    ['echo with logprobs', { prompt, echo: true, logprobs: 1 }, '/v1/completions'],
    ['echo on chat', { messages: [{ role: 'user', content: 'hi' }], echo: true }, '/v1/chat/completions']]) {
    const x = await rawPost(srv, path, JSON.stringify(body));
    check(`${what}: 400 naming echo`, x.status === 400 && x.json.error.param === 'echo', x.text.slice(0, 200));
  }
}

async function chat(srv) {
  const c = client(srv);
  const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about Lily.' }];
  const chat = await c.chat.completions.create({ model: MODEL_ID, messages, max_tokens: 20, temperature: 0 });
  const cm = chat.choices[0];
  check('chat: id, object, message', chat.id.startsWith('chatcmpl-') && chat.object === 'chat.completion' &&
        cm.message.role === 'assistant' && typeof cm.message.content === 'string' && cm.message.content.length > 0,
        JSON.stringify(chat).slice(0, 300));
  check('chat: usage.prompt_tokens equals llmopt tokenize of the ChatML prompt',
        chat.usage.prompt_tokens === tokenCount(chatml(messages)), `${chat.usage.prompt_tokens} vs ${tokenCount(chatml(messages))}`);
  check('chat: finish_reason and completion_tokens', ['stop', 'length'].includes(cm.finish_reason) &&
        (cm.finish_reason === 'stop' || chat.usage.completion_tokens === 20), `${cm.finish_reason} ${chat.usage.completion_tokens}`);
  const cs = await streamChat(c, { model: MODEL_ID, messages, max_tokens: 20, temperature: 0,
                                   stream_options: { include_usage: true } });
  check('chat stream: role chunk, same text, chunk object', cs.role === 'assistant' && cs.text === cm.message.content &&
        cs.object === 'chat.completion.chunk' && cs.id.startsWith('chatcmpl-'), JSON.stringify(cs.text));
  check('chat stream: usage', cs.usage && cs.usage.prompt_tokens === chat.usage.prompt_tokens &&
        cs.usage.completion_tokens === chat.usage.completion_tokens, JSON.stringify(cs.usage));
  const parts = await c.chat.completions.create({ model: MODEL_ID, max_tokens: 20, temperature: 0, messages: [
    messages[0], { role: 'user', content: [{ type: 'text', text: 'Tell me ' }, { type: 'text', text: 'about Lily.' }] }] });
  check('chat: content parts are joined', parts.choices[0].message.content === cm.message.content);
  const mc = await c.chat.completions.create({ model: MODEL_ID, messages, max_completion_tokens: 5, temperature: 0 });
  check('chat: max_completion_tokens', mc.usage.completion_tokens <= 5 && (mc.choices[0].finish_reason === 'length' || mc.usage.completion_tokens < 5));
}

async function stops(srv) {
  const c = client(srv);
  const prompt = 'Once upon a time, there was a little girl';
  const full = (await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 48, temperature: 0 })).choices[0].text;
  // A stop string spanning several tokens, somewhere after the start.
  const at = full.indexOf(' ', 12);
  const stop = full.slice(at, at + 7);
  const want = full.slice(0, full.indexOf(stop));
  const r = await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 48, temperature: 0, stop });
  check('stop: text ends before the stop string, finish_reason stop',
        r.choices[0].text === want && r.choices[0].finish_reason === 'stop', `${JSON.stringify(r.choices[0].text)} vs ${JSON.stringify(want)} (stop ${JSON.stringify(stop)})`);
  const s = await streamCompletion(c, { model: MODEL_ID, prompt, max_tokens: 48, temperature: 0, stop: ['zzzz', stop] });
  check('stop (stream, list): never emitted, same text', s.text === want && !s.text.includes(stop) && s.finish === 'stop',
        JSON.stringify(s.text));
  const chatStop = await streamChat(c, { model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 40, temperature: 0 });
  if (chatStop.text.length > 8) {
    const st = chatStop.text.slice(3, 8);
    const cs = await streamChat(c, { model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 40, temperature: 0, stop: [st] });
    check('stop (chat stream)', cs.text === chatStop.text.slice(0, chatStop.text.indexOf(st)) && cs.finish === 'stop',
          `${JSON.stringify(cs.text)} stop ${JSON.stringify(st)}`);
  } else {
    check('stop (chat stream): reference text long enough', false, JSON.stringify(chatStop.text));
  }
}

async function seeds(srv) {
  const c = client(srv);
  const p = { model: MODEL_ID, prompt: 'The cat', max_tokens: 32, temperature: 1.0 };
  const a = (await c.completions.create({ ...p, seed: 42 })).choices[0].text;
  const b = (await c.completions.create({ ...p, seed: 42 })).choices[0].text;
  const d = (await c.completions.create({ ...p, seed: 4242 })).choices[0].text;
  check('seed: same seed, same text', a === b, `${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
  check('seed: another seed, another text', a !== d);
  const s = await streamCompletion(c, { ...p, seed: 42 });
  check('seed: streaming gives the same text', s.text === a);
  const k = await c.completions.create({ ...p, seed: 7, top_k: 5, top_p: 0.9, min_p: 0.05, presence_penalty: 0.5,
                                         frequency_penalty: 0.5, repetition_penalty: 1.1 });
  check('sampling parameters accepted', k.choices[0].text.length > 0);
}

async function logprobs(srv) {
  const c = client(srv);
  const r = await c.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hello' }],
                                              max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs?.content || [];
  check('chat logprobs: one entry per token', content.length === r.usage.completion_tokens && content.length > 0,
        `${content.length} vs ${r.usage.completion_tokens}`);
  check('chat logprobs: values <= 0 with bytes', content.every((e) => e.logprob <= 0 && Array.isArray(e.bytes) && typeof e.token === 'string'));
  check('chat logprobs: 3 top alternatives, best first, greedy picks the best',
        content.every((e) => e.top_logprobs.length === 3 && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob &&
                             e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob &&
                             Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6));
  check('chat logprobs: tokens spell the text', content.map((e) => e.token).join('').endsWith(r.choices[0].message.content.trimStart()) ||
        content.map((e) => e.token).join('').trim() === r.choices[0].message.content.trim(),
        JSON.stringify(content.map((e) => e.token).join('')) + ' vs ' + JSON.stringify(r.choices[0].message.content));
  const s = await streamChat(c, { model: MODEL_ID, messages: [{ role: 'user', content: 'Hello' }], max_tokens: 12,
                                  temperature: 0, logprobs: true, top_logprobs: 2 });
  check('chat logprobs (stream)', s.logprobs.length === content.length && s.logprobs.every((e, i) => Math.abs(e.logprob - content[i].logprob) < 1e-5));
  const cp = await c.completions.create({ model: MODEL_ID, prompt: 'Once upon', max_tokens: 8, temperature: 0, logprobs: 2 });
  const lp = cp.choices[0].logprobs;
  check('completion logprobs: tokens, token_logprobs <= 0, top_logprobs, text_offset',
        lp && lp.tokens.length === 8 && lp.token_logprobs.every((v) => v <= 0) && lp.top_logprobs.length === 8 &&
        Object.keys(lp.top_logprobs[0]).length === 2 && lp.text_offset.length === 8, JSON.stringify(lp).slice(0, 300));
  const none = await c.completions.create({ model: MODEL_ID, prompt: 'Once upon', max_tokens: 2, temperature: 0 });
  check('no logprobs unless asked', none.choices[0].logprobs === null);
}

async function badInput(srv) {
  const c = client(srv);
  const cases = [
    ['malformed JSON', '/v1/chat/completions', '{"messages": [', 400],
    ['body not an object', '/v1/completions', '[1,2]', 400],
    ['wrong type: temperature', '/v1/completions', JSON.stringify({ prompt: 'a', temperature: 'hot' }), 400, 'temperature'],
    ['wrong type: messages', '/v1/chat/completions', JSON.stringify({ messages: 'hi' }), 400, 'messages'],
    ['wrong type: max_tokens', '/v1/completions', JSON.stringify({ prompt: 'a', max_tokens: 'many' }), 400, 'max_tokens'],
    ['wrong type: stop', '/v1/completions', JSON.stringify({ prompt: 'a', stop: 5 }), 400, 'stop'],
    ['out of range: top_p', '/v1/completions', JSON.stringify({ prompt: 'a', top_p: 3 }), 400, 'top_p'],
    ['missing prompt', '/v1/completions', JSON.stringify({ max_tokens: 3 }), 400, 'prompt'],
    ['empty messages', '/v1/chat/completions', JSON.stringify({ messages: [] }), 400, 'messages'],
    ['bad role', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'wizard', content: 'x' }] }), 400],
    ['unknown model', '/v1/chat/completions', JSON.stringify({ model: 'gpt-17', messages: [{ role: 'user', content: 'x' }] }), 404, 'model'],
    ['n = 2', '/v1/completions', JSON.stringify({ prompt: 'a', n: 2 }), 400, 'n'],
    ['top_logprobs without logprobs', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x' }], top_logprobs: 2 }), 400],
    ['prompt longer than the context', '/v1/completions', JSON.stringify({ prompt: 'Once upon a time '.repeat(400) }), 400, 'prompt'],
    ['token ids outside the vocabulary', '/v1/completions', JSON.stringify({ prompt: [1, 99999] }), 400, 'prompt'],
    ['invalid UTF-8', '/v1/completions', Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]), 400],
    ['lone surrogate escape', '/v1/completions', '{"prompt": "\\ud800"}', 400],
    ['deep nesting', '/v1/completions', '{"prompt": "a", "x": ' + '['.repeat(5000) + ']'.repeat(5000) + '}', 400],
    ['oversized body', '/v1/completions', JSON.stringify({ prompt: 'x'.repeat(300_000) }), 413],
  ];
  for (const [name, p, body, status, param] of cases) {
    const r = await rawPost(srv, p, body);
    const e = r.json?.error;
    const shape = e && typeof e.message === 'string' && typeof e.type === 'string' && 'param' in e && 'code' in e;
    check(`bad input: ${name} -> ${status}`, r.status === status && shape && (!param || e.param === param),
          `${r.status} ${r.text.slice(0, 200)}`);
  }
  // Oversized without a Content-Length (chunked upload): the cap holds while reading.
  const big = new ReadableStream({ start(ctl) { for (let i = 0; i < 40; i++) ctl.enqueue(new TextEncoder().encode('x'.repeat(10_000))); ctl.close(); } });
  try {
    const r = await fetch(base(srv) + '/v1/completions', { method: 'POST', body: big, duplex: 'half', headers: { 'Content-Type': 'application/json' } });
    check('bad input: oversized chunked body -> 413', r.status === 413, String(r.status));
  } catch (err) {
    check('bad input: oversized chunked body -> 413', false, String(err));
  }
  const u = await fetch(base(srv) + '/v1/nothing');
  check('unknown URL -> 404', u.status === 404);
  const m = await fetch(base(srv) + '/v1/completions');
  check('GET on a POST endpoint -> 405', m.status === 405);
  // The OpenAI client surfaces these as typed errors.
  try {
    await c.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] });
    check('client: unknown model raises NotFoundError', false);
  } catch (err) {
    check('client: unknown model raises NotFoundError', err instanceof OpenAI.NotFoundError, String(err));
  }
  check('still serving after bad input', await healthy(srv) &&
        (await c.completions.create({ model: MODEL_ID, prompt: 'Once', max_tokens: 4 })).choices[0].text.length > 0);
}

async function auth() {
  const srv = await startServer(['--api-key', 'sekrit', '--no-prefix-cache']);
  try {
    for (const [name, key] of [['wrong key', 'nope'], ['missing key', null]]) {
      const r = await fetch(base(srv) + '/v1/models', { headers: key ? { Authorization: `Bearer ${key}` } : {} });
      const j = await r.json();
      check(`auth: ${name} -> 401`, r.status === 401 && j.error && j.error.type, `${r.status}`);
    }
    try {
      await client(srv, 'wrong').completions.create({ model: MODEL_ID, prompt: 'a', max_tokens: 2 });
      check('auth: client with a wrong key raises AuthenticationError', false);
    } catch (err) {
      check('auth: client with a wrong key raises AuthenticationError', err instanceof OpenAI.AuthenticationError, String(err));
    }
    const ok = await client(srv, 'sekrit').completions.create({ model: MODEL_ID, prompt: 'a', max_tokens: 2 });
    const long = { model: MODEL_ID, prompt: 'One day a little dog ran to the big tree in the park and saw a bird ' +
                   'sitting on a branch, singing a happy song to the sun.', max_tokens: 2, temperature: 0 };
    await client(srv, 'sekrit').completions.create(long);
    const again = await client(srv, 'sekrit').completions.create(long);
    check('--no-prefix-cache: a repeated prompt is computed again', again.usage.prompt_tokens > 32 &&
          again.usage.prompt_tokens_details?.cached_tokens === 0, JSON.stringify(again.usage));
    check('auth: right key is served', ok.choices.length === 1);
    check('auth: /health needs no key', await healthy(srv));
    // Request bodies are handled off the event loop: while four 3 MB prompts are being
    // tokenized (each then refused as longer than the context), /health still answers
    // at once, before any of them is done.
    const words = 'the little girl ran to the park and saw a big dog '.repeat(65000);
    let firstBig = Infinity, healthAt = Infinity;
    const t0 = performance.now();
    const bigs = [0, 1, 2, 3].map(() => fetch(base(srv) + '/v1/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: 'Bearer sekrit' },
      body: JSON.stringify({ prompt: words, max_tokens: 1 }),
    }).then(async (r) => { await r.text(); firstBig = Math.min(firstBig, performance.now() - t0); return r.status; }));
    await new Promise((r) => setTimeout(r, 50));
    const h = await fetch(base(srv) + '/health');
    healthAt = performance.now() - t0;
    // a small request does not queue behind them: small bodies are handled on the event loop
    const small = await client(srv, 'sekrit').completions.create({ model: MODEL_ID, prompt: 'a', max_tokens: 2 });
    const smallAt = performance.now() - t0;
    const statuses = await Promise.all(bigs);
    check('big prompts: /health answers while they are tokenized', h.status === 200 && healthAt < firstBig &&
          statuses.every((st) => st === 400), `health at ${healthAt.toFixed(0)} ms, first big reply at ${firstBig.toFixed(0)} ms, ${statuses}`);
    check('big prompts: a small request is answered before them', small.choices.length === 1 && smallAt < firstBig,
          `small at ${smallAt.toFixed(0)} ms, first big reply at ${firstBig.toFixed(0)} ms`);
  } finally {
    const ex = await stopServer(srv);
    check('auth server: SIGTERM exits 0', ex.code === 0, JSON.stringify(ex));
  }
}

async function overloadAndCancel() {
  const srv = await startServer(['--parallel', '1', '--queue', '1']);
  try {
    const c = client(srv);
    const body = (n) => ({ model: MODEL_ID, prompt: 'Once upon a time', max_tokens: n, temperature: 0 });
    const results = await Promise.allSettled([0, 1, 2, 3].map(() => streamCompletion(c, body(200))));
    const ok = results.filter((r) => r.status === 'fulfilled');
    const busy = results.filter((r) => r.status === 'rejected' && r.reason?.status === 503);
    check('overload: queue full -> 503, the others complete', ok.length >= 2 && busy.length >= 1 && ok.length + busy.length === 4,
          results.map((r) => r.status === 'fulfilled' ? 'ok' : String(r.reason?.status || r.reason)).join(','));
    // A client that goes away mid-stream frees its slot. stories260K makes 400 tokens in
    // ~15 ms, so on a loaded machine the stream can end before the server sees the
    // client leave: then nothing was left to cancel, and the attempt is repeated.
    let blocks = -1, cancelled = 0, attempts = 0;
    const cancelledBefore = (await metrics(srv)).get('llmopt_requests_cancelled_total') || 0;
    while (attempts < 5 && cancelled <= cancelledBefore) {
      attempts++;
      const stream = await c.completions.create({ ...body(400), stream: true });
      let n = 0;
      for await (const ch of stream) { if (ch.choices.length && ++n === 5) break; } // break aborts the request
      for (let i = 0; i < 50; i++) {
        const m = await metrics(srv);
        blocks = m.get('llmopt_kv_blocks_in_use');
        cancelled = m.get('llmopt_requests_cancelled_total') || 0;
        if (blocks === 0 && m.get('llmopt_requests_running') === 0) break;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    check('disconnect: the request is cancelled and its KV blocks freed',
          blocks === 0 && cancelled > cancelledBefore, `blocks ${blocks}, cancelled ${cancelled}, attempts ${attempts}`);
    const again = await c.completions.create(body(4));
    check('disconnect: the slot serves the next request', again.choices[0].text.length > 0);
  } finally {
    await stopServer(srv);
  }
}

// Raw bytes on a socket: whatever comes back, the server must stay up.
function rawExchange(srv, bytes, ms = 2000) {
  return new Promise((resolve) => {
    const sock = net.connect(srv.port, '127.0.0.1');
    let got = '';
    const done = () => { sock.destroy(); resolve(got); };
    const t = setTimeout(done, ms);
    sock.on('data', (d) => { got += d.toString('latin1'); });
    sock.on('error', () => { clearTimeout(t); done(); });
    sock.on('close', () => { clearTimeout(t); done(); });
    sock.write(bytes);
  });
}

function mutate(buf, rnd) {
  const b = Buffer.from(buf);
  const n = 1 + Math.floor(rnd() * 4);
  for (let i = 0; i < n && b.length; i++) {
    const at = Math.floor(rnd() * b.length);
    switch (Math.floor(rnd() * 4)) {
      case 0: b[at] = Math.floor(rnd() * 256); break;
      case 1: b[at] = '{}[]":,0-e\\'.charCodeAt(Math.floor(rnd() * 11)); break;
      case 2: return Buffer.concat([b.subarray(0, at), b.subarray(at + 1 + Math.floor(rnd() * 8))]);
      default: return Buffer.concat([b.subarray(0, at), b.subarray(at, at + 1 + Math.floor(rnd() * 16)), b.subarray(at)]);
    }
  }
  return b;
}

async function abuse(srv) {
  const hostile = [
    ['garbage request line', 'HELLO THERE\r\n\r\n'],
    ['HTTP/0.9', 'GET /health\r\n\r\n'],
    ['bad Content-Length', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}'],
    ['huge Content-Length', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999\r\n\r\n{}'],
    ['huge header', 'GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ' + 'a'.repeat(200_000) + '\r\n\r\n'],
    ['bad chunked body', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n'],
    ['truncated body then close', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt":'],
    ['NUL bytes', 'GET /\0health HTTP/1.1\r\nHost: x\r\n\r\n'],
  ];
  for (const [name, bytes] of hostile) {
    await rawExchange(srv, bytes, 500);
    check(`abuse: ${name}: still serving`, await healthy(srv));
  }
  // Mutated request bodies: each gets a JSON answer (an OpenAI error or a completion).
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const corpus = readdirSync(path.join(here, 'corpus')).map((f) => readFileSync(path.join(here, 'corpus', f)));
  let bad = 0, total = 0;
  const N = QUICK ? 60 : 200;
  for (let i = 0; i < N; i++) {
    const body = mutate(corpus[i % corpus.length], rnd);
    const p = i % 2 ? '/v1/completions' : '/v1/chat/completions';
    try {
      const r = await fetch(base(srv) + p, { method: 'POST', body, headers: { 'Content-Type': 'application/json' },
                                             signal: AbortSignal.timeout(20_000) });
      const text = await r.text();
      total++;
      let okShape = false;
      try {
        const j = text.startsWith('data: ') ? { sse: true } : JSON.parse(text);
        okShape = r.status === 200 ? true : (j.error && typeof j.error.message === 'string' && r.status >= 400 && r.status < 600);
      } catch { okShape = false; }
      if (!okShape) { bad++; if (bad < 4) console.log(`     unexpected answer ${r.status}: ${text.slice(0, 120)}`); }
    } catch (err) { bad++; if (bad < 4) console.log(`     request failed: ${err}`); }
  }
  check(`abuse: ${N} mutated bodies each get a proper answer`, bad === 0 && total === N, `${bad} bad of ${N}`);
  check('abuse: still serving afterwards', await healthy(srv));
}

async function metricsCheck(srv) {
  const m = await metrics(srv);
  const need = ['llmopt_requests_total{endpoint="/v1/completions",status="200"}',
                'llmopt_requests_total{endpoint="/v1/chat/completions",status="200"}',
                'llmopt_requests_total{endpoint="/v1/completions",status="400"}',
                'llmopt_prompt_tokens_total', 'llmopt_generated_tokens_total', 'llmopt_queue_depth', 'llmopt_kv_blocks_in_use'];
  for (const k of need) check(`metrics: ${k}`, m.get(k) !== undefined, '');
  check('metrics: TTFT and ITL histograms', /llmopt_time_to_first_token_seconds_bucket\{le="\+Inf"\} [1-9]/.test(m.text) &&
        /llmopt_inter_token_latency_seconds_count [1-9]/.test(m.text) && m.text.includes('# TYPE llmopt_inter_token_latency_seconds histogram'));
}

function rssKiB(pid) {
  const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/);
  return m ? Number(m[1]) : NaN;
}

async function load() {
  const N = 32, TOKENS = QUICK ? 32 : 64;
  const srv = await startServer(['--parallel', String(N), '--ctx', '256']);
  try {
    const c = client(srv);
    const words = ['Lily', 'Tom', 'the dog', 'a bird', 'Ben', 'the sun', 'Mom', 'a fish'];
    const prompts = Array.from({ length: N }, (_, i) => `Once upon a time, ${words[i % 8]} ${['saw', 'had', 'wanted', 'found'][i % 4]} ${i}`);
    const req = (p) => ({ model: MODEL_ID, prompt: p, max_tokens: TOKENS, temperature: 0 });
    const ntok = (r) => r.usage?.completion_tokens ?? TOKENS;

    // One client: each request alone, one after the other (twice; the better pass
    // counts, as the better of the concurrent rounds does below).
    const alone = [];
    let t0, tps1 = 0;
    for (let pass = 0; pass < 2; pass++) {
      t0 = performance.now();
      let tokens1 = 0;
      for (const [i, p] of prompts.entries()) {
        const r = await streamCompletion(c, { ...req(p), stream_options: { include_usage: true } });
        if (pass === 0) alone.push(r.text);
        else if (r.text !== alone[i]) alone[i] = null; // greedy must repeat itself
        tokens1 += ntok(r);
      }
      tps1 = Math.max(tps1, tokens1 / ((performance.now() - t0) / 1000));
    }
    check('load: greedy requests run alone repeat themselves', alone.every((t) => t !== null));

    // 32 clients at once, three rounds; outputs must equal the lone runs.
    const rss = [];
    let tps32 = 0, allSame = true, allDone = true, blocksZero = true;
    for (let round = 0; round < 3; round++) {
      t0 = performance.now();
      const rs = await Promise.allSettled(prompts.map((p) => streamCompletion(c, { ...req(p), stream_options: { include_usage: true } })));
      const secs = (performance.now() - t0) / 1000;
      const done = rs.filter((r) => r.status === 'fulfilled').map((r) => r.value);
      allDone &&= done.length === N;
      allSame &&= rs.every((r, i) => r.status === 'fulfilled' && r.value.text === alone[i]);
      tps32 = Math.max(tps32, done.reduce((a, r) => a + ntok(r), 0) / secs);
      let blocks = -1;
      for (let i = 0; i < 20 && blocks !== 0; i++) {
        blocks = (await metrics(srv)).get('llmopt_kv_blocks_in_use');
        if (blocks !== 0) await new Promise((r) => setTimeout(r, 50));
      }
      blocksZero &&= blocks === 0;
      rss.push(rssKiB(srv.pid));
    }
    console.log(`     throughput: 1 client ${tps1.toFixed(0)} tok/s, ${N} clients ${tps32.toFixed(0)} tok/s ` +
                `(${(tps32 / tps1).toFixed(2)}x); RSS per round ${rss.map((k) => (k / 1024).toFixed(1)).join(' / ')} MiB`);
    check(`load: all ${N}x3 concurrent streams complete`, allDone);
    check('load: outputs equal the same requests run alone (greedy)', allSame);
    check('load: KV blocks in use return to zero after each round', blocksZero);
    check('load: RSS stable across rounds (within 8 MiB)', rss[2] - rss[1] < 8 * 1024, rss.join(' '));
    if (MIN_SPEEDUP > 0)
      check(`load: throughput with ${N} clients >= ${MIN_SPEEDUP}x one client`, tps32 >= MIN_SPEEDUP * tps1,
            `${tps32.toFixed(0)} vs ${tps1.toFixed(0)} tok/s`);
  } finally {
    const ex = await stopServer(srv);
    check('load server: SIGTERM exits 0', ex.code === 0, JSON.stringify(ex));
  }
}

// A section that throws counts as one failure; the others still run.
// Prefix reuse: a repeated prompt takes its full KV blocks (16 positions each, all but
// the block of the last token) from the cache, and gives the same greedy text.
async function prefixCache(srv) {
  const c = client(srv);
  const prompt = 'Once upon a time, there was a little girl named Lily. She loved to play outside ' +
                 'in the park with her friends and her big red ball every single day.';
  const n = tokenCount(prompt), full = Math.floor((n - 1) / 16) * 16;
  const before = (await metrics(srv)).get('llmopt_prompt_tokens_cached_total');
  const a = await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 16, temperature: 0 });
  const b = await c.completions.create({ model: MODEL_ID, prompt, max_tokens: 16, temperature: 0 });
  const cached = b.usage.prompt_tokens_details?.cached_tokens;
  check('prefix cache: a repeated prompt reuses its full KV blocks', full >= 32 && cached === full,
        `${cached} cached of ${n} (${full} in full blocks); first ${JSON.stringify(a.usage)}`);
  check('prefix cache: the same greedy text', a.choices[0].text === b.choices[0].text,
        `${JSON.stringify(a.choices[0].text)} vs ${JSON.stringify(b.choices[0].text)}`);
  const s = await streamCompletion(c, { model: MODEL_ID, prompt, max_tokens: 16, temperature: 0,
                                        stream_options: { include_usage: true } });
  check('prefix cache: streamed usage reports cached tokens too', s.usage?.prompt_tokens_details?.cached_tokens === full &&
        s.text === a.choices[0].text, JSON.stringify(s.usage));
  const m = await metrics(srv);
  check('prefix cache: /metrics counts cached prompt tokens and cached blocks',
        m.get('llmopt_prompt_tokens_cached_total') - before >= 2 * full && m.get('llmopt_kv_blocks_cached') >= full / 16,
        `${m.get('llmopt_prompt_tokens_cached_total')} - ${before}, ${m.get('llmopt_kv_blocks_cached')} blocks`);
}

async function section(name, fn) {
  try {
    await fn();
  } catch (err) {
    check(`${name}: no unexpected exception`, false, err?.stack || String(err));
  }
}

async function main() {
  const srv = await startServer(['--parallel', '4', '--ctx', '512', '--max-body', '262144']);
  try {
    for (const [name, fn] of [['basics', basics], ['chat', chat], ['stop sequences', stops], ['seeds', seeds],
                              ['logprobs', logprobs], ['prefix cache', prefixCache], ['bad input', badInput], ['abuse', abuse],
                              ['metrics', metricsCheck]])
      await section(name, () => fn(srv));
  } finally {
    const ex = await stopServer(srv);
    check('server: SIGTERM exits 0', ex.code === 0, JSON.stringify(ex) + '\n' + srv.logText().slice(-500));
  }
  await section('auth', auth);
  await section('overload and cancel', overloadAndCancel);
  await section('load', load);
}

main().catch((err) => {
  check('no unexpected exception', false, err?.stack || String(err));
}).finally(() => {
  clearTimeout(guard);
  killAll();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
});
