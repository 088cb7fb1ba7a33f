// The official `openai` npm package against a live daemon: node openai_checks.mjs BASE_URL TOKEN
// Prints one JSON line per check ({"check": name, "ok": true|false, ...}); exits 1 if any failed.
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 120_000 });
const greedy = { temperature: 0 };
const ask = (text) => [{ role: "user", content: text }];
let failed = false;

async function check(name, body) {
  try {
    const details = await body();
    console.log(JSON.stringify({ check: name, ok: true, ...details }));
  } catch (e) {
    failed = true;
    console.log(JSON.stringify({ check: name, ok: false, error: String(e?.stack ?? e) }));
  }
}

function assert(condition, message) {
  if (!condition) throw new Error(message);
}

async function refusedWith(status, call) {
  try {
    await call();
  } catch (e) {
    assert(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
    assert(e.status === status, `status ${e.status}, wanted ${status}: ${e.message}`);
    return { status: e.status, code: e.code };
  }
  throw new Error(`no error; wanted ${status}`);
}

const model = (await client.models.list()).data[0].id;

await check("chat", async () => {
  const r = await client.chat.completions.create({ model, messages: ask("What is the capital of France?"), max_tokens: 30, ...greedy });
  // What the model says is not asserted (it rounds otherwise on another CPU): the shape of the answer is.
  assert(r.choices[0].message.content.trim().length > 0 && r.choices[0].message.role === "assistant", JSON.stringify(r.choices[0]));
  assert(["stop", "length"].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  return { text: r.choices[0].message.content, usage: r.usage };
});

await check("streaming", async () => {
  const messages = ask("Tell me a story about a dragon.");
  // The first call puts the prompt in the cache, so the two compared are computed alike.
  await client.chat.completions.create({ model, messages, max_tokens: 1, ...greedy });
  const whole = await client.chat.completions.create({ model, messages, max_tokens: 32, ...greedy });
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 32, stream: true, stream_options: { include_usage: true }, ...greedy });
  let text = "", events = 0, usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length && chunk.choices[0].delta.content) { text += chunk.choices[0].delta.content; events++; }
    if (chunk.usage) usage = chunk.usage;
  }
  assert(events > 3, `only ${events} content events`);
  assert(text === whole.choices[0].message.content, `streamed ${JSON.stringify(text)} != ${JSON.stringify(whole.choices[0].message.content)}`);
  assert(usage && usage.completion_tokens === whole.usage.completion_tokens, `usage ${JSON.stringify(usage)}`);
  return { events };
});

await check("session_holds_earlier_turns", async () => {
  const messages = ask("My name is Aria. Remember it.");
  let reply, before;
  for (const next of ["I am a blacksmith.", "What is my name?", null]) {
    before = reply;
    reply = await client.chat.completions.create({ model, messages, max_tokens: 24, user: "aria-js", ...greedy },
                                                 { headers: { "X-Session-Id": "aria-js" } });
    if (next === null) break;
    messages.push({ role: "assistant", content: reply.choices[0].message.content }, { role: "user", content: next });
  }
  // The mechanism, not the model's words: the last turn's prompt holds the turn before it (its
  // prompt and reply) and all of that came from the session's cache.
  const held = before.usage.prompt_tokens + before.usage.completion_tokens;
  assert(reply.usage.prompt_tokens > held, `prompt ${reply.usage.prompt_tokens} does not hold the ${held} tokens before it`);
  assert(reply.usage.prompt_tokens_details.cached_tokens >= held - 2, JSON.stringify(reply.usage));
  return { text: reply.choices[0].message.content, usage: reply.usage };
});

await check("json_schema", async () => {
  const schema = { type: "object", additionalProperties: false, required: ["action", "line"],
                   properties: { action: { type: "string", enum: ["attack", "flee", "trade"] }, line: { type: "string", maxLength: 60 } } };
  const r = await client.chat.completions.create({ model, messages: ask("A bandit blocks the road. What do you do?"), max_tokens: 80, ...greedy,
    response_format: { type: "json_schema", json_schema: { name: "npc_action", schema } } });
  const value = JSON.parse(r.choices[0].message.content);
  assert(["attack", "flee", "trade"].includes(value.action) && typeof value.line === "string", JSON.stringify(value));
  assert(Object.keys(value).sort().join() === "action,line", JSON.stringify(value));
  return { value };
});

await check("wrong_token_401", async () => {
  const wrong = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "not-the-token-at-all", maxRetries: 0 });
  return refusedWith(401, () => wrong.chat.completions.create({ model, messages: ask("Hi"), max_tokens: 2 }));
});

await check("n_2_is_400", async () => refusedWith(400, () => client.chat.completions.create({ model, messages: ask("Hi"), max_tokens: 2, n: 2 })));

await check("two_megabytes_is_413", async () =>
  refusedWith(413, () => client.chat.completions.create({ model, messages: ask("a".repeat(2 << 20)), max_tokens: 2 })));

await check("cancel_by_abort", async () => {
  const stream = await client.completions.create({ model, prompt: "Here is a very long list of every number from 1 to 1000:\n1\n2\n3\n",
                                                   max_tokens: 2000, stream: true, ...greedy });
  let events = 0;
  for await (const chunk of stream) {
    if (++events === 3) { stream.controller.abort(); break; }
  }
  return { events, aborted_at: Date.now() };
});

process.exit(failed ? 1 : 0);
