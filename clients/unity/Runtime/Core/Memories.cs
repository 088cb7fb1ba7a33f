using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>
    /// What a session remembers with (the daemon's MemoryOptions): the scope its turns become memories
    /// of when they leave the context (default: the session id), the scopes each turn recalls from
    /// (default: that scope alone), and how much a turn may recall. A scope is any name: one NPC
    /// ("smith"), one NPC and one player ("smith/p1"), or shared by several NPCs ("village").
    /// </summary>
    public sealed class MemoryOptions
    {
        public string Scope;
        public List<string> ReadScopes;
        /// <summary>Prompt tokens the recalled memories may take; 0: an eighth of the context.</summary>
        public uint MaxTokens;
        /// <summary>At most this many memories a turn (1 to 32); 0: 4.</summary>
        public uint K;
        /// <summary>Only memories carrying every one of these tags are recalled.</summary>
        public List<string> Tags;
        /// <summary>No recall, and turns that leave the context are not kept.</summary>
        public bool Off;

        internal JsonObject ToJson()
        {
            var json = new JsonObject();
            if (!string.IsNullOrEmpty(Scope)) json["scope"] = Scope;
            if (ReadScopes != null && ReadScopes.Count > 0) json["readScopes"] = new List<object>(ReadScopes);
            if (MaxTokens != 0) json["maxTokens"] = MaxTokens;
            if (K != 0) json["k"] = K;
            if (Tags != null && Tags.Count > 0) json["tags"] = new List<object>(Tags);
            if (Off) json["off"] = true;
            return json;
        }
    }

    /// <summary>One memory: a turn that left a session's context ("context") or one the game added ("game").</summary>
    public sealed class Memory
    {
        public ulong Id;
        public string Scope;
        public string Text;
        public List<string> Tags;
        public long CreatedUnixMs;
        public string Source;
        public string SessionId;
        /// <summary>For memories from the context: the session's user turn it was (1 = the first).</summary>
        public uint Turn;
        /// <summary>Times it was told to the model; the least used leave first when a scope is full.</summary>
        public uint Uses;

        internal static Memory FromJson(JsonObject json)
        {
            var tags = new List<string>();
            var items = json.GetArray("tags");
            if (items != null)
                foreach (var t in items)
                    tags.Add((string)t);
            return new Memory
            {
                Id = json.GetUInt64("id"), Scope = json.GetString("scope"), Text = json.GetString("text"), Tags = tags,
                CreatedUnixMs = json.GetInt64("createdUnixMs"), Source = json.GetString("source"),
                SessionId = json.GetString("sessionId"), Turn = json.GetUInt32("turn"), Uses = json.GetUInt32("uses"),
            };
        }

        internal static List<Memory> ListFromJson(JsonObject json, string key)
        {
            var list = new List<Memory>();
            var items = json.GetArray(key);
            if (items != null)
                foreach (var item in items)
                    list.Add(FromJson((JsonObject)item));
            return list;
        }
    }

    /// <summary>A memory a search found, with its cosine similarity to the query (-1 to 1).</summary>
    public sealed class RecalledMemory
    {
        public Memory Memory;
        public float Score;
    }

    /// <summary>
    /// NPC memory: seed what an NPC knows, search what it would recall, list and forget. Turns that leave
    /// a session's context become memories by themselves, and each turn recalls the best of the scopes
    /// its session reads (NpcConversation.Memory, GenerateRequest.Memory).
    /// </summary>
    public static class Memories
    {
        /// <summary>Add memories to `scope` (up to 64 texts of 4 KB a call).</summary>
        public static async Task<List<Memory>> RememberAsync(this SidecarClient client, string scope, IList<string> texts,
            IList<string> tags = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (texts == null)
                throw new ArgumentNullException("texts");
            var request = new JsonObject { { "scope", scope ?? "" }, { "texts", new List<object>(texts) } };
            if (tags != null && tags.Count > 0) request["tags"] = new List<object>(tags);
            var json = await client.Transport.CallAsync("Remember", request, cancellationToken).ConfigureAwait(false);
            return Memory.ListFromJson(json, "memories");
        }

        /// <summary>The `k` memories of `scopes` closest to `query`, best first.</summary>
        public static async Task<List<RecalledMemory>> RecallAsync(this SidecarClient client, string query, IList<string> scopes,
            uint k = 0, IList<string> tags = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (scopes == null)
                throw new ArgumentNullException("scopes");
            var request = new JsonObject { { "query", query ?? "" }, { "scopes", new List<object>(scopes) } };
            if (k != 0) request["k"] = k;
            if (tags != null && tags.Count > 0) request["tags"] = new List<object>(tags);
            var json = await client.Transport.CallAsync("Recall", request, cancellationToken).ConfigureAwait(false);
            var found = new List<RecalledMemory>();
            var items = json.GetArray("memories");
            if (items != null)
                foreach (var item in items)
                {
                    var o = (JsonObject)item;
                    found.Add(new RecalledMemory { Memory = Memory.FromJson(o.GetObject("memory")), Score = (float)o.GetDouble("score") });
                }
            return found;
        }

        /// <summary>Forget memories by id, or those carrying every tag (within `scope`, or everywhere), or
        /// a whole scope (only `scope` given). Returns how many went.</summary>
        public static async Task<uint> ForgetAsync(this SidecarClient client, IList<ulong> ids = null, IList<string> tags = null,
            string scope = null, CancellationToken cancellationToken = default(CancellationToken))
        {
            var request = new JsonObject();
            if (ids != null && ids.Count > 0)
            {
                var list = new List<object>();
                foreach (var id in ids)
                    list.Add(id.ToString(System.Globalization.CultureInfo.InvariantCulture));
                request["ids"] = list;
            }
            if (tags != null && tags.Count > 0) request["tags"] = new List<object>(tags);
            if (!string.IsNullOrEmpty(scope)) request["scope"] = scope;
            var json = await client.Transport.CallAsync("Forget", request, cancellationToken).ConfigureAwait(false);
            return json.GetUInt32("forgotten");
        }

        /// <summary>A page of `scope`'s memories (every scope when null), oldest first, and how many there are.</summary>
        public static async Task<KeyValuePair<List<Memory>, uint>> ListMemoriesAsync(this SidecarClient client, string scope = null,
            uint offset = 0, uint limit = 0, CancellationToken cancellationToken = default(CancellationToken))
        {
            var request = new JsonObject();
            if (!string.IsNullOrEmpty(scope)) request["scope"] = scope;
            if (offset != 0) request["offset"] = offset;
            if (limit != 0) request["limit"] = limit;
            var json = await client.Transport.CallAsync("ListMemories", request, cancellationToken).ConfigureAwait(false);
            return new KeyValuePair<List<Memory>, uint>(Memory.ListFromJson(json, "memories"), json.GetUInt32("total"));
        }
    }
}
