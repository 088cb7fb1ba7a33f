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

await check("n_17_is_400", async () => refusedWith(400, () => client.chat.completions.create({ model, messages: ask("Hi"), max_tokens: 2, n: 17 })));

await check("two_megabytes_is_413", async () =>
  refusedWith(413, () => client.chat.completions.create({ model, messages: ask("a".repeat(2 << 20)), max_tokens: 2 })));

// -- Issue 28: what a plugin moving from llama-server or LM Studio sends --------------------------
// Shapes, counts and constraints only, never what the model says.

const smith = [{ role: "system", content: "You are Brann, the blacksmith of Oakvale. You speak in short, gruff sentences." },
               { role: "user", content: "What do you sell?" }];
// A token's bytes as the key it is compared by (a token holding part of a character is no text).
const hex = (entry) => Buffer.from(entry.bytes).toString("hex");

await check("n_3_choices", async () => {
  const r = await client.chat.completions.create({ model, messages: smith, n: 3, max_tokens: 8, temperature: 1.0, seed: 7 });
  assert(r.choices.map((c) => c.index).join() === "0,1,2", `indices ${JSON.stringify(r.choices.map((c) => c.index))}`);
  for (const c of r.choices) {
    assert(["stop", "length"].includes(c.finish_reason), `choice ${c.index}: finish_reason ${c.finish_reason}`);
    assert(c.message.role === "assistant" && typeof c.message.content === "string", JSON.stringify(c));
  }
  // Three replies of at most 8 tokens each; the prompt counted once.
  assert(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 3 * 8, JSON.stringify(r.usage));
  return { usage: r.usage };
});

await check("logprobs_one_entry_per_token", async () => {
  const r = await client.chat.completions.create({ model, messages: smith, max_tokens: 8, logprobs: true, top_logprobs: 3, ...greedy });
  const content = r.choices[0].logprobs?.content;
  assert(Array.isArray(content) && content.length === r.usage.completion_tokens,
         `${content?.length} entries for ${r.usage.completion_tokens} completion tokens`);
  const text = Buffer.concat(content.map((e) => Buffer.from(e.bytes))).toString("utf8");
  assert(text === r.choices[0].message.content, `entries' bytes ${JSON.stringify(text)} != ${JSON.stringify(r.choices[0].message.content)}`);
  for (const e of content) {
    assert(e.logprob <= 0 && e.top_logprobs.length === 3, JSON.stringify(e));
    assert(e.top_logprobs.every((t, i) => t.logprob <= 0 && (i === 0 || t.logprob <= e.top_logprobs[i - 1].logprob)),
           `top_logprobs not likeliest first: ${JSON.stringify(e.top_logprobs)}`);
    // No token is likelier than the likeliest, and one of the top is the very token: the same figure.
    assert(e.logprob <= e.top_logprobs[0].logprob + 1e-4, JSON.stringify(e));
    const same = e.top_logprobs.find((t) => hex(t) === hex(e));
    assert(same === undefined || Math.abs(same.logprob - e.logprob) < 1e-4, JSON.stringify(e));
  }
  return { entries: content.length };
});

await check("logit_bias_bans_tokens", async () => {
  const first = await client.chat.completions.create({ model, messages: smith, max_tokens: 6, logprobs: true, ...greedy });
  const banned = new Map(); // bytes (hex) -> token id, found with llama-server's POST /tokenize
  for (const e of first.choices[0].logprobs.content) {
    const text = Buffer.from(e.bytes).toString("utf8");
    if (!Buffer.from(text, "utf8").equals(Buffer.from(e.bytes))) continue; // part of a character: no text to tokenize
    const { tokens } = await client.post("/tokenize", { body: { content: text, parse_special: false } });
    if (tokens.length === 1) banned.set(hex(e), tokens[0]);
  }
  assert(banned.size > 0, `no token of the first reply is one token alone: ${JSON.stringify(first.choices[0].logprobs.content)}`);
  const logit_bias = Object.fromEntries([...banned.values()].map((id) => [String(id), -100]));
  const r = await client.chat.completions.create({ model, messages: smith, max_tokens: 12, logprobs: true, logit_bias, ...greedy });
  const chosen = r.choices[0].logprobs.content;
  assert(chosen.length === r.usage.completion_tokens && chosen.length > 0, `${chosen.length} entries`);
  const hits = chosen.filter((e) => banned.has(hex(e))).map((e) => e.token);
  assert(hits.length === 0, `banned tokens were chosen: ${JSON.stringify(hits)} (bias ${JSON.stringify(logit_bias)})`);
  return { banned: logit_bias, chosen: chosen.map((e) => e.token) };
});

await check("gbnf_grammar", async () => {
  // llama-server's `grammar`, an extra body field: the npm client sends what it is given.
  const r = await client.chat.completions.create({ model, messages: ask("Will you join the quest? Answer in a long speech."),
                                                   max_tokens: 16, grammar: 'root ::= "Aye" | "Nay"', ...greedy });
  assert(["Aye", "Nay"].includes(r.choices[0].message.content), `reply ${JSON.stringify(r.choices[0].message.content)}`);
  assert(r.choices[0].finish_reason === "stop", `finish_reason ${r.choices[0].finish_reason}: the grammar ends the reply`);
  return { text: r.choices[0].message.content };
});

await check("base_url_without_v1", async () => {
  const bare = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
  const listed = await bare.models.list();
  assert(listed.data.length === 1 && listed.data[0].id === model, JSON.stringify(listed.data));
  const r = await bare.chat.completions.create({ model, messages: ask("Hi"), max_tokens: 4, ...greedy });
  assert(r.object === "chat.completion" && r.choices[0].message.role === "assistant", JSON.stringify(r));
  assert(r.usage.completion_tokens >= 1 && ["stop", "length"].includes(r.choices[0].finish_reason), JSON.stringify(r));
  return { text: r.choices[0].message.content };
});

await check("any_model_name", async () => {
  const chat = await client.chat.completions.create({ model: "gpt-3.5-turbo", messages: ask("Hi"), max_tokens: 2 });
  assert(chat.model === model && chat.choices.length === 1, `model ${chat.model}, served ${model}`);
  const text = await client.completions.create({ model: "gpt-3.5-turbo-instruct", prompt: "Once upon a time", max_tokens: 2 });
  assert(text.model === model && text.choices.length === 1, `model ${text.model}, served ${model}`);
  return { model: chat.model };
});

await check("embeddings_base64_decoded", async () => {
  const input = ["The player gave the smith a ring.", "Rain over the harbour.", "A dragon sleeps under the mountain."];
  // No encoding_format: the npm client asks for base64 and decodes it into numbers itself.
  const r = await client.embeddings.create({ model: "text-embedding-3-small", input });
  assert(r.data.length === 3 && r.data.map((d) => d.index).join() === "0,1,2", JSON.stringify(r.data.map((d) => d.index)));
  const width = r.data[0].embedding.length;
  assert(width > 1 && r.data.every((d) => d.embedding.length === width), `lengths ${r.data.map((d) => d.embedding.length)}`);
  for (const d of r.data) {
    assert(d.embedding.every(Number.isFinite), `input ${d.index}: not numbers`);
    const norm = Math.sqrt(d.embedding.reduce((sum, x) => sum + x * x, 0));
    assert(Math.abs(norm - 1) < 1e-3, `input ${d.index}: |v| = ${norm}`);
  }
  assert(r.usage.prompt_tokens > 0 && r.usage.total_tokens === r.usage.prompt_tokens, JSON.stringify(r.usage));
  // The base64 was what was asked for: the same vector as the one asked for in floats.
  const floats = await client.embeddings.create({ model, input: input[0], encoding_format: "float" });
  const v = floats.data[0].embedding;
  const diff = Math.max(...v.map((x, i) => Math.abs(x - r.data[0].embedding[i])));
  assert(v.length === width && diff < 1e-3, `float and base64 differ by ${diff} (lengths ${v.length}, ${width})`);
  return { width, usage: r.usage };
});

await check("max_tokens_above_the_limit_is_clamped", async () => {
  const limit = (await client.get("/props")).max_tokens_per_request; // llama-server's /props, with the daemon's limit
  assert(Number.isInteger(limit) && limit > 0, `max_tokens_per_request ${limit}`);
  const { data: r, response } = await client.chat.completions
    .create({ model, messages: ask("Hi"), max_tokens: limit + 100_000, ...greedy }).withResponse();
  assert(response.headers.get("x-max-tokens-clamped") === String(limit), `X-Max-Tokens-Clamped ${response.headers.get("x-max-tokens-clamped")}`);
  const { finish_reason } = r.choices[0], tokens = r.usage.completion_tokens;
  // Served, not refused: cut at the limit ("length") if it ran that far, else stopped by the model.
  assert(finish_reason === "length" ? tokens === limit : finish_reason === "stop" && tokens <= limit, `${finish_reason} after ${tokens} of ${limit}`);
  return { limit, finish_reason, tokens };
});

await check("assistant_message_with_two_tool_calls", async () => {
  const tool = (name, property) => ({ type: "function", function: { name, description: `${name} for the guest`,
    parameters: { type: "object", required: [property], properties: { [property]: { type: "string" } } } } });
  const tools = [tool("give_item", "item"), tool("wave", "to")];
  // Longer than a message's own framing, so that the bound below needs the call itself, not only its result.
  const bard = "the old bard in the green hat who sits by the fire, sings of dragons and plays the lute all night long";
  const calls = [{ id: "call_1", type: "function", function: { name: "give_item", arguments: JSON.stringify({ item: "ale" }) } },
                 { id: "call_2", type: "function", function: { name: "wave", arguments: JSON.stringify({ to: bard }) } }];
  const results = { call_1: "The guest holds a mug of ale.", call_2: "The bard lifts his lute and waves back." };
  const conversation = (made) => [{ role: "system", content: "You are Marta, the innkeeper." },
    { role: "user", content: "An ale, please, and greet the bard for me." },
    { role: "assistant", content: null, tool_calls: made },
    ...made.map((c) => ({ role: "tool", tool_call_id: c.id, content: results[c.id] }))];
  const prompt = async (made) => (await client.chat.completions.create({ model, messages: conversation(made), tools, tool_choice: "none",
                                                                            max_tokens: 1 })).usage.prompt_tokens;
  const one = await prompt(calls.slice(0, 1)), two = await prompt(calls);
  // Both calls and both results reached the model: at least the second call's argument and result.
  const count = async (text) => (await client.post("/tokenize", { body: { content: text } })).tokens.length;
  const least = (await count(bard)) + (await count(results.call_2));
  assert(two >= one + least, `prompt ${two} tokens with two calls, ${one} with one: the second's ${least} are not all there`);
  return { one, two, least };
});

// Last: the Python side checks that the aborted request is gone within seconds of the abort.
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
