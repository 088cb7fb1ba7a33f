using System;
using System.Collections.Generic;
using System.Threading;
using System.Threading.Tasks;

namespace Xlm.Sidecar
{
    /// <summary>What was saved or restored of one session (the daemon's SavedSessionInfo).</summary>
    public sealed class SavedSessionInfo
    {
        public string SessionId;
        public uint Tokens;
        public ulong KvBytes;
        /// <summary>"kv" (its KV cache comes back: the next turn computes only the new line) or
        /// "text" (the next turn computes the conversation again); empty: not saved.</summary>
        public string Restored;
        /// <summary>Why "text" (or why not saved): e.g. "another model: ...".</summary>
        public string Reason;

        internal static SavedSessionInfo FromJson(JsonObject json)
        {
            return new SavedSessionInfo
            {
                SessionId = json.GetString("sessionId"), Tokens = json.GetUInt32("tokens"), KvBytes = json.GetUInt64("kvBytes"),
                Restored = json.GetString("restored"), Reason = json.GetString("reason"),
            };
        }

        internal static List<SavedSessionInfo> ListFromJson(JsonObject json)
        {
            var list = new List<SavedSessionInfo>();
            var items = json.GetArray("sessions");
            if (items != null)
                foreach (var item in items)
                    list.Add(FromJson((JsonObject)item));
            return list;
        }
    }

    /// <summary>A save: the bytes to keep in the game's own save file, and what is in them.</summary>
    public sealed class SessionSave
    {
        public byte[] Data;
        public List<SavedSessionInfo> Sessions;

        /// <summary>The bytes as a string for PlayerPrefs or a JSON save (base64: a third larger).</summary>
        public string ToBase64() { return Convert.ToBase64String(Data); }
    }

    /// <summary>
    /// Save games: NPCs' conversations as bytes the game keeps in its own save (the daemon writes no
    /// files), restored later, after the daemon (or the game) restarted. With `includeKv` the KV caches
    /// go too (large: tens of MB per long conversation), so a restored NPC answers as fast as one that
    /// never left; the daemon restores them only where it serves the same model with the same settings,
    /// and rebuilds the others from their text, saying which (SavedSessionInfo.Restored).
    /// </summary>
    public static class SessionSaves
    {
        /// <summary>Parts of an import larger than this go as an upload (the daemon's default message
        /// limit is 8 MiB, a WebSocket frame carries base64).</summary>
        public const int ImportPartBytes = 2 << 20;

        /// <summary>Save `sessionIds` (every session when null or empty).</summary>
        public static async Task<SessionSave> ExportSessionsAsync(this SidecarClient client, IList<string> sessionIds = null,
            bool includeKv = false, CancellationToken cancellationToken = default(CancellationToken))
        {
            var request = new JsonObject { { "includeKv", includeKv }, { "chunkBytes", 1 << 20 } };
            if (sessionIds != null && sessionIds.Count > 0)
                request["sessionIds"] = new List<object>(sessionIds);
            var parts = new List<byte[]>();
            List<SavedSessionInfo> sessions = null;
            var size = 0;
            // Runs on the transport's thread, one message at a time, in order.
            Action<JsonObject> onMessage = json =>
            {
                var data = Convert.FromBase64String(json.GetString("data"));
                parts.Add(data);
                size += data.Length;
                if (json.GetBool("last"))
                    sessions = SavedSessionInfo.ListFromJson(json);
            };
            await client.Transport.StreamAsync("ExportSessions", request, onMessage, cancellationToken).ConfigureAwait(false);
            if (sessions == null)
                throw new SidecarException(SidecarStatusCode.Internal, "ExportSessions", "the export ended before its last chunk");
            var all = new byte[size];
            var at = 0;
            foreach (var p in parts)
            {
                Buffer.BlockCopy(p, 0, all, at, p.Length);
                at += p.Length;
            }
            return new SessionSave { Data = all, Sessions = sessions };
        }

        /// <summary>Restore the sessions of a save; INVALID_ARGUMENT (nothing changed) for a damaged or
        /// foreign archive, or ids that exist unless `replace`.</summary>
        public static async Task<List<SavedSessionInfo>> ImportSessionsAsync(this SidecarClient client, byte[] archive,
            bool replace = false, CancellationToken cancellationToken = default(CancellationToken))
        {
            if (archive == null)
                throw new ArgumentNullException("archive");
            JsonObject reply;
            if (archive.Length <= ImportPartBytes)
            {
                reply = await client.Transport.CallAsync("ImportSessions", new JsonObject { { "archive", Convert.ToBase64String(archive) }, { "replace", replace } },
                    cancellationToken).ConfigureAwait(false);
                return SavedSessionInfo.ListFromJson(reply);
            }
            var upload = "unity-" + Guid.NewGuid().ToString("N");
            reply = null;
            for (var start = 0; start < archive.Length; start += ImportPartBytes)
            {
                var part = new byte[Math.Min(ImportPartBytes, archive.Length - start)];
                Buffer.BlockCopy(archive, start, part, 0, part.Length);
                var request = new JsonObject { { "archive", Convert.ToBase64String(part) }, { "replace", replace }, { "uploadId", upload },
                                               { "more", start + part.Length < archive.Length } };
                reply = await client.Transport.CallAsync("ImportSessions", request, cancellationToken).ConfigureAwait(false);
            }
            return SavedSessionInfo.ListFromJson(reply);
        }

        /// <summary>ImportSessionsAsync of a save kept as a base64 string (SessionSave.ToBase64).</summary>
        public static Task<List<SavedSessionInfo>> ImportSessionsAsync(this SidecarClient client, string base64,
            bool replace = false, CancellationToken cancellationToken = default(CancellationToken))
        {
            return client.ImportSessionsAsync(Convert.FromBase64String(base64), replace, cancellationToken);
        }
    }
}
