// `kvasir serve` through a client nobody here wrote: the `openai` npm package, against a server in
// front of a three-stage ring of stories260K (started by serve_openai_test.py, which passes the
// servers' URLs in the environment). Answers equal `kvasir generate` for the same seed and chat
// template, streamed and not; sixteen concurrent streams each get their own answer; a client that
// aborts mid-stream frees its session on every stage; every refusal has its status and shape.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';

const env = process.env;
const require = createRequire(path.join(env.NPM_DIR, 'package.json'));
const OpenAI = require('openai');
const Ajv = require('ajv');

const KVASIR = env.KVASIR;
const MODEL_FILE = env.MODEL_FILE;
const API_KEY = env.API_KEY;
const client = new OpenAI({ baseURL: env.SERVE_URL + '/v1', apiKey: API_KEY, maxRetries: 0 });
const DEADLINE_MS = 30000;

let failed = 0;
async function test(name, body) {
  const t0 = Date.now();
  try {
    await body();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

// What `kvasir generate` prints for the same request, on the whole model in one process.
function generate(args) {
  return execFileSync(KVASIR, ['generate', '-m', MODEL_FILE, '-t', '1', ...args], {
    encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'],
  });
}

async function streamedText(stream, chat) {
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    const c = chunk.choices[0];
    text += chat ? (c.delta.content ?? '') : c.text;
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage };
}

// Polls /health (no key needed) until `done(stages)` holds, or fails after the deadline.
async function untilStages(done, what) {
  const end = Date.now() + DEADLINE_MS;
  let last;
  while (Date.now() < end) {
    const r = await fetch(env.SERVE_URL + '/health');
    if (r.status === 200) {
      last = (await r.json()).stages;
      if (done(last)) return last;
    }
    await new Promise((ok) => setTimeout(ok, 20));
  }
  throw new Error(`${what} within ${DEADLINE_MS} ms; stages: ${JSON.stringify(last)}`);
}

async function expectError(promise, status, check) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
    assert.equal(e.status, status, e.message);
    if (check) check(e);
    return e;
  }
  assert.fail(`expected HTTP ${status}`);
}

const prompt = 'Once upon a time';
const chatMessages = [
  { role: 'system', content: 'You tell short stories.' },
  { role: 'user', content: 'Tell me about a dog.' },
];

await test('a completion equals kvasir generate for the same seed', async () => {
  const expected = generate(['-p', prompt, '-n', '40', '--temp', '0.8', '--seed', '42']);
  const r = await client.completions.create({
    model: 'stories260K', prompt, max_tokens: 40, temperature: 0.8, seed: 42,
  });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 40);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 40);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
});

await test('a streamed completion equals kvasir generate', async () => {
  const expected = generate(['-p', prompt, '-n', '40', '--temp', '0', '--seed', '1']);
  const stream = await client.completions.create({
    model: 'stories260K', prompt, max_tokens: 40, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  const got = await streamedText(stream, false);
  assert.equal(got.text, expected);
  assert.equal(got.finish, 'length');
  assert.equal(got.usage.completion_tokens, 40);
});

await test('a chat completion equals kvasir generate with the same template', async () => {
  const expected = generate(['--chat-template', 'chatml', '-sys', chatMessages[0].content, '-p',
    chatMessages[1].content, '-n', '48', '--temp', '0.7', '--seed', '3']);
  const r = await client.chat.completions.create({
    model: 'stories260K', messages: chatMessages, max_tokens: 48, temperature: 0.7, seed: 3,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, expected);
  const stream = await client.chat.completions.create({
    model: 'stories260K', messages: chatMessages, max_tokens: 48, temperature: 0.7, seed: 3,
    stream: true,
  });
  const got = await streamedText(stream, true);
  assert.equal(got.text, expected);
  assert.equal(got.finish, r.choices[0].finish_reason);
});

await test('stop strings: the text before the first one, nothing of it streamed', async () => {
  const full = generate(['-p', prompt, '-n', '48', '--temp', '0']);
  const at = full.indexOf(' ', full.length / 2);
  const stop = full.slice(at, full.indexOf(' ', at + 1));
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({
    prompt, max_tokens: 48, temperature: 0, stop: ['never there', stop],
  });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const got = await streamedText(await client.completions.create({
    prompt, max_tokens: 48, temperature: 0, stop, stream: true,
  }), false);
  assert.equal(got.text, expected);
  assert.equal(got.finish, 'stop');
});

await test('sixteen concurrent streaming clients each get their own answer', async () => {
  const prompts = ['Once upon a time', 'The dog', 'Lily saw', 'Tom had', 'One day', 'The sun',
    'A little bird', 'Mom said'];
  const expected = prompts.map((p, i) => generate(['-p', p, '-n', '32', '--temp', '0.9',
    '--seed', String(100 + i)]));
  const runs = [];
  for (let i = 0; i < 16; i++) {
    const k = i % prompts.length;
    runs.push((async () => streamedText(await client.completions.create({
      prompt: prompts[k], max_tokens: 32, temperature: 0.9, seed: 100 + k, stream: true,
    }), false))());
  }
  const got = await Promise.all(runs);
  got.forEach((g, i) => assert.equal(g.text, expected[i % prompts.length], `client ${i}`));
});

await test('a client aborting mid-stream frees its session on every stage', async () => {
  await untilStages((s) => s.every((x) => x.sessions_open === 0), 'no idle ring');
  const stream = await client.completions.create({
    prompt: 'Once', max_tokens: 2000, stream: true, ignore_eos: true,
  });
  let chunks = 0;
  for await (const chunk of stream) {
    if (++chunks === 3) {
      // The session is open on every stage while it streams...
      await untilStages((s) => s.length === 3 && s.every((x) => x.sessions_open === 1),
        'the session never showed on every stage');
      stream.controller.abort();
      break;
    }
  }
  // ... and closed on every stage once the client has gone.
  await untilStages((s) => s.length === 3 && s.every((x) => x.sessions_open === 0),
    'the session was not freed on every stage');
});

await test('json_schema output parses and validates against its schema, streamed or not',
  async () => {
    const schema = {
      type: 'object',
      properties: {
        name: { type: 'string', minLength: 1, maxLength: 16 },
        age: { type: 'integer', minimum: 1, maximum: 99 },
        friends: { type: 'array', items: { type: 'string', maxLength: 10 }, maxItems: 3 },
        mood: { enum: ['happy', 'sad', 'sleepy'] },
      },
      required: ['name', 'age', 'mood'],
      additionalProperties: false,
    };
    const validate = new Ajv().compile(schema);
    const response_format = { type: 'json_schema', json_schema: { name: 'dog', strict: true,
      schema } };
    for (const [temperature, seed] of [[0, 1], [0.8, 5], [1.0, 9]]) {
      const r = await client.chat.completions.create({
        messages: chatMessages, max_tokens: 600, temperature, seed, response_format,
      });
      const content = r.choices[0].message.content;
      assert.equal(r.choices[0].finish_reason, 'stop', content);
      const value = JSON.parse(content);
      assert.ok(validate(value), `${content}: ${JSON.stringify(validate.errors)}`);
      const got = await streamedText(await client.chat.completions.create({
        messages: chatMessages, max_tokens: 600, temperature, seed, response_format,
        stream: true,
      }), true);
      assert.equal(got.text, content, 'streamed and whole answers differ');
    }
    // Any object: unbounded, so an answer cut at max_tokens is only the start of one.
    const obj = await client.completions.create({
      prompt, max_tokens: 300, temperature: 0, response_format: { type: 'json_object' },
    });
    const text = obj.choices[0].text;
    assert.match(text, /^\{/);
    if (obj.choices[0].finish_reason === 'stop') {
      const value = JSON.parse(text);
      assert.ok(typeof value === 'object' && !Array.isArray(value) && value !== null, text);
    }
  });

await test('logprobs: one entry per token of the text, the greedy pick the most likely',
  async () => {
    const r = await client.chat.completions.create({
      messages: chatMessages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.map((e) => e.token).join(''), r.choices[0].message.content);
    for (const e of content) {
      assert.ok(e.logprob <= 0);
      assert.equal(e.top_logprobs.length, 3);
      assert.equal(e.top_logprobs[0].token, e.token);
      assert.equal(e.top_logprobs[0].logprob, e.logprob);
      assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
      assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    }
    // Streamed: the same entries, spread over the chunks.
    const stream = await client.chat.completions.create({
      messages: chatMessages, max_tokens: 24, temperature: 0, logprobs: true, top_logprobs: 3,
      stream: true,
    });
    const streamed = [];
    for await (const chunk of stream) {
      const c = chunk.choices[0];
      if (c?.logprobs?.content) streamed.push(...c.logprobs.content);
    }
    assert.deepEqual(streamed, content);
    const c = await client.completions.create({ prompt, max_tokens: 16, temperature: 0,
      logprobs: 2 });
    const l = c.choices[0].logprobs;
    assert.equal(l.tokens.join(''), c.choices[0].text);
    assert.equal(l.token_logprobs.length, l.tokens.length);
    assert.equal(l.text_offset[0], 0);
    assert.ok(Object.keys(l.top_logprobs[0]).length >= 1);
  });

// Tool calls through the client's own shapes: the calls of a whole answer, and those the client
// puts together from a stream's delta.tool_calls.
async function streamedCalls(stream) {
  const calls = [];
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) finish = c.finish_reason;
    content += c.delta.content ?? '';
    for (const d of c.delta.tool_calls ?? []) {
      if (d.id) {
        assert.equal(d.index, calls.length, 'calls come in order');
        assert.equal(d.type, 'function');
        calls.push({ id: d.id, name: d.function.name, arguments: d.function.arguments ?? '',
          pieces: 1 });
      } else {
        calls[d.index].arguments += d.function.arguments;
        calls[d.index].pieces++;
      }
    }
  }
  return { calls, finish, content };
}

await test('tool calls: required and named choices return calls that validate, streamed or not',
  async () => {
    const weather = {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 12 },
        days: { type: 'integer', minimum: 1, maximum: 7 },
        unit: { enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'days', 'unit'],
      additionalProperties: false,
    };
    const time = { type: 'object', properties: { city: { type: 'string', maxLength: 12 } },
      required: ['city'] };
    const tools = [
      { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
        parameters: weather } },
      { type: 'function', function: { name: 'get_time', parameters: time } },
    ];
    const ajv = new Ajv();
    const validate = { get_weather: ajv.compile(weather), get_time: ajv.compile(time) };
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const named = { type: 'function', function: { name: 'get_weather' } };
    // One call each (parallel_tool_calls false), then up to eight with room for all of them.
    for (const [tool_choice, parallel_tool_calls, seed, max_tokens] of [['required', false, 1, 400],
      [named, false, 2, 400], ['required', false, 7, 400], ['required', true, 1, 1300]]) {
      const request = { messages, tools, tool_choice, parallel_tool_calls, max_tokens,
        temperature: 0.8, seed };
      const r = await client.chat.completions.create(request);
      const choice = r.choices[0];
      const what = JSON.stringify(choice);
      assert.equal(choice.finish_reason, 'tool_calls', what);
      assert.equal(choice.message.content, null, what);
      const calls = choice.message.tool_calls;
      if (parallel_tool_calls) assert.ok(calls.length >= 1, what);
      else assert.equal(calls.length, 1, what);
      for (const c of calls) {
        assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
        assert.equal(c.type, 'function');
        if (tool_choice === named) assert.equal(c.function.name, 'get_weather');
        const args = JSON.parse(c.function.arguments);
        assert.ok(validate[c.function.name](args),
          `${c.function.arguments}: ${JSON.stringify(validate[c.function.name].errors)}`);
      }
      const got = await streamedCalls(await client.chat.completions.create({ ...request,
        stream: true }));
      assert.equal(got.finish, 'tool_calls');
      assert.equal(got.content, '', 'no markup streamed as content');
      assert.deepEqual(got.calls.map((c) => [c.name, c.arguments]),
        calls.map((c) => [c.function.name, c.function.arguments]));
      // An enforced call streams as it is written: its arguments in several pieces.
      assert.ok(got.calls.every((c) => c.pieces > 2), JSON.stringify(got.calls));
      // The next turn: the assistant's calls and a result for each.
      const next = await client.chat.completions.create({
        messages: [...messages, choice.message, ...calls.map((c) => ({
          role: 'tool', tool_call_id: c.id, content: 'Sunny, 21 degrees.' }))],
        tools, max_tokens: 12, temperature: 0,
      });
      assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
    }
  });

await test('tool calls in Qwen3.5\'s XML format: required and named, streamed or not, validate',
  async () => {
    const qwen = new OpenAI({ baseURL: env.QWEN_URL + '/v1', apiKey: 'none', maxRetries: 0 });
    const weather = {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 12 },
        days: { type: 'integer', minimum: 1, maximum: 7 },
        unit: { enum: ['celsius', 'fahrenheit'] },
        where: { type: 'object', properties: { lat: { type: 'number' } }, required: ['lat'],
          additionalProperties: false },
      },
      required: ['city', 'days', 'unit'],
      additionalProperties: false,
    };
    const time = { type: 'object', properties: { zone: { type: 'string', maxLength: 8 } } };
    const tools = [
      { type: 'function', function: { name: 'get_weather', parameters: weather } },
      { type: 'function', function: { name: 'get_time', parameters: time } },
    ];
    const ajv = new Ajv();
    const validate = { get_weather: ajv.compile(weather), get_time: ajv.compile(time) };
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const named = { type: 'function', function: { name: 'get_weather' } };
    for (const [tool_choice, parallel_tool_calls, seed] of [['required', false, 3],
      [named, false, 4], ['required', true, 5]]) {
      const request = { messages, tools, tool_choice, parallel_tool_calls, max_tokens: 1500,
        temperature: 0.8, seed };
      const r = await qwen.chat.completions.create(request);
      const choice = r.choices[0];
      const what = JSON.stringify(choice);
      assert.equal(choice.finish_reason, 'tool_calls', what);
      assert.equal(choice.message.content, null, what);
      const calls = choice.message.tool_calls;
      assert.ok(parallel_tool_calls ? calls.length >= 1 : calls.length === 1, what);
      for (const c of calls) {
        if (tool_choice === named) assert.equal(c.function.name, 'get_weather');
        const args = JSON.parse(c.function.arguments);
        assert.ok(validate[c.function.name](args),
          `${c.function.arguments}: ${JSON.stringify(validate[c.function.name].errors)}`);
      }
      const got = await streamedCalls(await qwen.chat.completions.create({ ...request,
        stream: true }));
      assert.equal(got.finish, 'tool_calls');
      assert.equal(got.content, '', 'no markup streamed as content');
      assert.deepEqual(got.calls.map((c) => [c.name, c.arguments]),
        calls.map((c) => [c.function.name, c.function.arguments]));
      const next = await qwen.chat.completions.create({
        messages: [...messages, choice.message, ...calls.map((c) => ({
          role: 'tool', tool_call_id: c.id, content: 'Sunny, 21 degrees.' }))],
        tools, tool_choice: 'none', max_tokens: 12, temperature: 0,  // the tools block is long
      });
      assert.ok(['stop', 'length', 'tool_calls'].includes(next.choices[0].finish_reason));
    }
  });

await test('tool calls: "none" lays out no tools, "auto" leaves the model free', async () => {
  const tools = [{ type: 'function', function: { name: 'get_time', parameters: {
    type: 'object', properties: { city: { type: 'string' } } } } }];
  const plain = await client.chat.completions.create({
    messages: chatMessages, max_tokens: 32, temperature: 0.7, seed: 4,
  });
  const none = await client.chat.completions.create({
    messages: chatMessages, tools, tool_choice: 'none', max_tokens: 32, temperature: 0.7, seed: 4,
  });
  assert.equal(none.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
  // With the tools in the prompt, a model that never learnt to call answers in text.
  const auto = await client.chat.completions.create({
    messages: chatMessages, tools, max_tokens: 32, temperature: 0.7, seed: 4,
  });
  assert.ok(auto.usage.prompt_tokens > plain.usage.prompt_tokens, 'the tools are in the prompt');
  assert.equal(typeof auto.choices[0].message.content, 'string');
  assert.equal(auto.choices[0].message.tool_calls, undefined);
  assert.ok(['stop', 'length'].includes(auto.choices[0].finish_reason));
  const streamed = await streamedCalls(await client.chat.completions.create({
    messages: chatMessages, tools, max_tokens: 32, temperature: 0.7, seed: 4, stream: true,
  }));
  assert.equal(streamed.content, auto.choices[0].message.content);
  assert.deepEqual(streamed.calls, []);
});

await test('models lists the served model', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['stories260K']);
});

await test('refusals: wrong types, unknown model, over the context, n, key, size', async () => {
  await expectError(client.completions.create({ prompt, temperature: 'hot' }), 400, (e) => {
    assert.equal(e.param, 'temperature');
    assert.equal(e.code, 'invalid_type');
  });
  await expectError(client.completions.create({ prompt, n: 2 }), 400,
    (e) => assert.equal(e.param, 'n'));
  await expectError(client.chat.completions.create({ messages: chatMessages, top_logprobs: 2 }),
    400, (e) => assert.equal(e.param, 'top_logprobs'));
  await expectError(client.chat.completions.create({
    messages: chatMessages, response_format: { type: 'json_schema', json_schema: { name: 'x',
      schema: { type: 'integer', multipleOf: 3 } } },
  }), 400, (e) => {
    assert.equal(e.param, 'response_format');
    assert.match(e.message, /multipleOf/);
  });
  await expectError(client.chat.completions.create({
    messages: chatMessages, tools: [{ type: 'function', function: { name: 'f', parameters: {
      type: 'object', properties: { n: { type: 'integer', multipleOf: 3 } } } } }],
  }), 400, (e) => {
    assert.equal(e.param, 'tools[0].function.parameters');
    assert.match(e.message, /multipleOf/);
  });
  await expectError(client.chat.completions.create({
    messages: chatMessages, tools: [{ type: 'function', function: { name: 'f' } }],
    tool_choice: { type: 'function', function: { name: 'g' } },
  }), 400, (e) => assert.equal(e.param, 'tool_choice.function.name'));
  await expectError(client.completions.create({ model: 'gpt-4', prompt }), 404,
    (e) => assert.equal(e.code, 'model_not_found'));
  await expectError(client.completions.create({ prompt: 'dog '.repeat(2500), max_tokens: 4 }),
    400, (e) => assert.equal(e.code, 'context_length_exceeded'));
  const stranger = new OpenAI({ baseURL: env.SERVE_URL + '/v1', apiKey: 'not-the-key-0123456',
    maxRetries: 0 });
  await expectError(stranger.completions.create({ prompt }), 401,
    (e) => assert.equal(e.code, 'invalid_api_key'));
  const malformed = await fetch(env.SERVE_URL + '/v1/completions', {
    method: 'POST', body: '{"prompt": ', headers: { Authorization: `Bearer ${API_KEY}` },
  });
  assert.equal(malformed.status, 400);
  assert.equal((await malformed.json()).error.code, 'invalid_json');
  const huge = await fetch(env.SERVE_URL + '/v1/completions', {
    method: 'POST', body: JSON.stringify({ prompt: 'x'.repeat(100000) }),
    headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
  });
  assert.equal(huge.status, 413);
  assert.equal((await huge.json()).error.code, 'request_too_large');
});

await test('too many sessions: 429 with Retry-After', async () => {
  // A server that takes one request at a time, and none waiting.
  const one = new OpenAI({ baseURL: env.BUSY_URL + '/v1', apiKey: 'none', maxRetries: 0 });
  const holding = await one.completions.create({
    prompt: 'Once', max_tokens: 1900, stream: true, ignore_eos: true,
  });
  const it = holding[Symbol.asyncIterator]();
  await it.next();  // it runs now
  const e = await expectError(one.completions.create({ prompt, max_tokens: 2 }), 429);
  const h = e.headers;
  assert.equal(typeof h.get === 'function' ? h.get('retry-after') : h['retry-after'], '1');
  assert.equal(e.code, 'too_many_sessions');
  holding.controller.abort();
});

await test('a ring that is down: 503 in /health and for requests', async () => {
  const health = await fetch(env.DOWN_URL + '/health');
  assert.equal(health.status, 503);
  assert.equal((await health.json()).error.code, 'ring_unavailable');
  const down = new OpenAI({ baseURL: env.DOWN_URL + '/v1', apiKey: 'none', maxRetries: 0 });
  await expectError(down.completions.create({ prompt }), 503,
    (e) => assert.equal(e.code, 'ring_unavailable'));
});

if (failed > 0) {
  console.log(`${failed} test(s) failed`);
  process.exit(1);
}
console.log('all passed');
