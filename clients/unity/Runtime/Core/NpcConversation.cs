using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// One NPC's conversation: a daemon session (its KV cache stays between turns, so a turn only
    /// computes the new line), the NPC's system prompt sent once, and one turn at a time.
    /// </summary>
    public sealed class NpcConversation
    {
        readonly SidecarClient client;
        int replying;
        bool started;
        bool attempted;
        bool resetNext;

        /// <param name="npcId">The session id: unique per NPC, and stable while the NPC should remember.</param>
        public NpcConversation(SidecarClient client, string npcId, string systemPrompt = null)
        {
            if (client == null)
                throw new ArgumentNullException("client");
            if (string.IsNullOrEmpty(npcId))
                throw new ArgumentException("each NPC needs its own id (the daemon's session id)", "npcId");
            this.client = client;
            NpcId = npcId;
            SystemPrompt = systemPrompt;
            MaxTokens = 200;
        }

        public string NpcId { get; private set; }
        /// <summary>Sent with the first turn (and after Reset); the daemon keeps it in the session.</summary>
        public string SystemPrompt { get; set; }
        /// <summary>Shared world context that opens the prompt before SystemPrompt (the persona). Give
        /// every NPC of a scene the very same text: the daemon computes it once and copies it to the
        /// others. Sent with the first turn (and after Reset), like SystemPrompt.</summary>
        public string Context { get; set; }
        public SamplingParams Sampling { get; set; }
        public uint MaxTokens { get; set; }
        public List<string> Stop { get; set; }
        /// <summary>Ask for each reply token's log probability with this many alternatives (0 to 20;
        /// GenerationResult.Logprobs); null: none.</summary>
        public uint? Logprobs { get; set; }
        /// <summary>What this NPC remembers with (its scope, the scopes it reads); null: its own id's scope.</summary>
        public MemoryOptions Memory { get; set; }
        public bool IsReplying { get { return Volatile.Read(ref replying) != 0; } }

        /// <summary>The player says `line`; `onText` gets the reply piece by piece (on the client's
        /// event context). Cancel with `cancellationToken` (OperationCanceledException). Throws
        /// InvalidOperationException while the NPC is still answering an earlier line.</summary>
        public Task<GenerationResult> SayAsync(string line, Action<string> onText = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            return TurnAsync(ChatMessage.User(line), null, null, null, null, onText, cancellationToken);
        }

        /// <summary>The player says `line` and the NPC answers within a GBNF `grammar` (llama.cpp's
        /// format, with a `root` rule): a fixed answer shape, e.g. <c>root ::= "Aye" | "Nay"</c>, or a
        /// line of a given form. INVALID_ARGUMENT for a grammar llama.cpp cannot parse.</summary>
        public Task<GenerationResult> SayInGrammarAsync(string line, string grammar, Action<string> onText = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (string.IsNullOrEmpty(grammar))
                throw new ArgumentException("a GBNF grammar is needed", "grammar");
            return TurnAsync(ChatMessage.User(line), null, grammar, null, null, onText, cancellationToken);
        }

        /// <summary>A structured action: the reply is JSON that validates against `jsonSchema`, parsed.
        /// FormatException when the reply is not whole JSON (e.g. cut by MaxTokens).</summary>
        public async Task<NpcAction> ActAsync(string situation, string jsonSchema,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (string.IsNullOrEmpty(jsonSchema))
                throw new ArgumentException("a JSON schema is needed for a structured action", "jsonSchema");
            var result = await TurnAsync(ChatMessage.User(situation), jsonSchema, null, null, null, null, cancellationToken).ConfigureAwait(false);
            object value;
            try
            {
                value = Json.Parse(result.Text);
            }
            catch (FormatException e)
            {
                var hint = result.FinishReason == FinishReason.Length ? " (cut at MaxTokens " + MaxTokens + ": raise it)" : "";
                throw new FormatException("NPC '" + NpcId + "' did not answer with whole JSON" + hint + ": " + e.Message, e);
            }
            return new NpcAction { Json = result.Text, Value = value, Result = result };
        }

        /// <summary>An NPC action as a function call: the NPC answers `situation` by calling one of
        /// `tools` (`choice`: Required by default, Function(name) for that one, Auto to allow words).
        /// result.ToolCall names the tool and carries its arguments, which fit the tool's schema;
        /// it is null when the NPC answered in words (Auto) or was cut short (FinishReason.Length).
        /// Tell the NPC how the action went with ToolResultAsync.</summary>
        public Task<GenerationResult> ChooseActionAsync(string situation, List<ToolDefinition> tools, ToolChoice choice = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            if (tools == null || tools.Count == 0)
                throw new ArgumentException("declare at least one tool the NPC may call", "tools");
            return TurnAsync(ChatMessage.User(situation), null, null, tools, choice, null, cancellationToken);
        }

        /// <summary>The game did what `call` asked: `result` (JSON or words) goes back to the NPC as
        /// the call's outcome, and the NPC goes on in words (streamed to `onText`). Pass `tools` to let
        /// it act again instead.</summary>
        public Task<GenerationResult> ToolResultAsync(ToolCall call, string result, Action<string> onText = null,
            List<ToolDefinition> tools = null, ToolChoice choice = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (call == null)
                throw new ArgumentNullException("call");
            return TurnAsync(call.ResultMessage(result), null, null, tools, choice, onText, cancellationToken);
        }

        /// <summary>Forget the conversation: the next turn starts over with the system prompt.</summary>
        public void Reset()
        {
            resetNext = true;
        }

        /// <summary>Free the NPC's session on the daemon (an NPC that was never spoken to has none).</summary>
        public async Task EndAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            if (!attempted)
                return;
            started = false;
            attempted = false;
            resetNext = false;
            try
            {
                await client.EndSessionAsync(NpcId, cancellationToken).ConfigureAwait(false);
            }
            catch (SidecarException e)
            {
                // Already gone (evicted past --max-sessions, or the daemon restarted): nothing to free.
                if (e.Code != SidecarStatusCode.NotFound)
                    throw;
            }
        }

        /// <summary>Save games: this NPC's conversation as bytes for the game's own save (with its KV
        /// cache when `includeKv`: large, but the NPC then resumes without recomputing it). Null when
        /// the NPC has no conversation to save (never spoken to, or ended).</summary>
        public async Task<byte[]> SaveAsync(bool includeKv = false, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (!attempted)
                return null;
            try
            {
                var save = await client.ExportSessionsAsync(new[] { NpcId }, includeKv, cancellationToken).ConfigureAwait(false);
                return save.Data;
            }
            catch (SidecarException e)
            {
                if (e.Code != SidecarStatusCode.NotFound)
                    throw;
                return null;  // the daemon restarted or ended it: nothing held to save
            }
        }

        /// <summary>SaveAsync as a base64 string (PlayerPrefs, a JSON save); null when nothing to save.</summary>
        public async Task<string> SaveBase64Async(bool includeKv = false, CancellationToken cancellationToken = default(CancellationToken))
        {
            var data = await SaveAsync(includeKv, cancellationToken).ConfigureAwait(false);
            return data == null ? null : Convert.ToBase64String(data);
        }

        /// <summary>Restore this NPC's conversation from SaveAsync's bytes, replacing what the daemon
        /// holds for it; the next line goes on from there (the system prompt is not sent again). Says
        /// whether its KV cache came back ("kv") or it is rebuilt from its text ("text", and why).
        /// INVALID_ARGUMENT, with nothing changed, for a damaged save or another NPC's.</summary>
        public async Task<SavedSessionInfo> LoadAsync(byte[] save, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (save == null || save.Length == 0)
                throw new ArgumentException("no save to load", "save");
            if (IsReplying)
                throw new InvalidOperationException("NPC '" + NpcId + "' is still answering: load once that turn ends");
            var restored = await client.ImportSessionsAsync(save, true, cancellationToken).ConfigureAwait(false);
            SavedSessionInfo mine = null;
            foreach (var info in restored)
                if (info.SessionId == NpcId)
                    mine = info;
            if (mine == null)
                throw new SidecarException(SidecarStatusCode.InvalidArgument, "ImportSessions",
                    "the save holds no conversation of NPC '" + NpcId + "'");
            started = true;
            attempted = true;
            resetNext = false;
            return mine;
        }

        /// <summary>LoadAsync of a save kept as base64 (SaveBase64Async).</summary>
        public Task<SavedSessionInfo> LoadAsync(string base64, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (string.IsNullOrEmpty(base64))
                throw new ArgumentException("no save to load", "base64");
            return LoadAsync(Convert.FromBase64String(base64), cancellationToken);
        }

        async Task<GenerationResult> TurnAsync(ChatMessage line, string jsonSchema, string grammar, List<ToolDefinition> tools,
            ToolChoice choice, Action<string> onText, CancellationToken ct)
        {
            if (line.Content == null)
                throw new ArgumentNullException("line");
            if (Interlocked.Exchange(ref replying, 1) != 0)
                throw new InvalidOperationException("NPC '" + NpcId + "' is still answering: wait for that turn or cancel it first");
            try
            {
                var fresh = !started || resetNext;
                var messages = new List<ChatMessage>();
                if (fresh && !string.IsNullOrEmpty(SystemPrompt))
                    messages.Add(ChatMessage.System(SystemPrompt));
                messages.Add(line);
                var request = new GenerateRequest
                {
                    Messages = messages,
                    SessionId = NpcId,
                    ResetSession = resetNext,
                    Sampling = Sampling,
                    MaxTokens = MaxTokens,
                    Stop = Stop,
                    JsonSchema = jsonSchema,
                    Context = fresh ? Context : null,
                    Tools = tools,
                    ToolChoice = choice,
                    Grammar = grammar,
                    Logprobs = Logprobs,
                    Memory = Memory,
                };
                Action<GenerateChunk> onChunk = null;
                if (onText != null)
                    onChunk = chunk => { if (chunk.Text.Length > 0) onText(chunk.Text); };
                attempted = true;
                GenerationResult result;
                try
                {
                    result = await client.GenerateAsync(request, onChunk, ct).ConfigureAwait(false);
                }
                catch (Exception)
                {
                    // A first turn that did not finish may still have left the system prompt in the
                    // session: start the next one over rather than send the system prompt twice.
                    if (fresh)
                        resetNext = true;
                    throw;
                }
                started = true;
                resetNext = false;
                return result;
            }
            finally
            {
                Volatile.Write(ref replying, 0);
            }
        }
    }

    /// <summary>A structured NPC action: the JSON text and its parsed value (JsonObject, list, ...).</summary>
    public sealed class NpcAction
    {
        public string Json;
        public object Value;
        public GenerationResult Result;

        /// <summary>The value as an object, or null when the schema asked for something else.</summary>
        public JsonObject Object { get { return Value as JsonObject; } }
    }
}
