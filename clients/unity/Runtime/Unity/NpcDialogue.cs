using System;
using System.Collections.Generic;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using UnityEngine;
using UnityEngine.Events;

namespace Xlm.Sidecar.Unity
{
    /// <summary>
    /// One NPC's dialogue: its own daemon session (it remembers the conversation), its system
    /// prompt, a reply streamed token by token into UI text (wire onTextChanged to a Text or
    /// TMP_Text), cancel, and structured actions constrained by a JSON schema. Events run on the main
    /// thread.
    /// </summary>
    [AddComponentMenu("XLM Sidecar/NPC Dialogue")]
    public sealed class NpcDialogue : MonoBehaviour
    {
        [SerializeField] SidecarLauncher launcher;
        [Tooltip("The NPC's session id, unique per NPC. Empty: the GameObject's name.")]
        [SerializeField] string npcId = "";
        [TextArea(3, 10)]
        [SerializeField] string systemPrompt = "You are a villager in a small fantasy town. Answer in one or two sentences.";
        [SerializeField] int maxTokens = 200;
        [Tooltip("0 is greedy; the daemon's default is 0.7.")]
        [SerializeField] float temperature = 0.7f;

        [Header("UI")]
        [Tooltip("The reply so far, each time a piece arrives: wire it to your text component's text.")]
        [SerializeField] UnityEvent<string> onTextChanged = new UnityEvent<string>();
        [Tooltip("The whole reply, when it is done.")]
        [SerializeField] UnityEvent<string> onReplyFinished = new UnityEvent<string>();

        readonly StringBuilder text = new StringBuilder();
        readonly CancellationTokenSource lifetime = new CancellationTokenSource();
        CancellationTokenSource turn;
        Task lastTurn;
        NpcConversation conversation;

        public SidecarLauncher Launcher { get { return launcher; } set { launcher = value; } }
        public string NpcId { get { return string.IsNullOrEmpty(npcId) ? gameObject.name : npcId; } set { npcId = value; } }
        public string SystemPrompt { get { return systemPrompt; } set { systemPrompt = value; } }
        public int MaxTokens { get { return maxTokens; } set { maxTokens = value; } }
        public float Temperature { get { return temperature; } set { temperature = value; } }
        /// <summary>Token id to a bias from -100 (never said) to 100, for every reply: a word this NPC
        /// must never say, or one it favours (SidecarClient.TokenizeAsync finds the ids). Null: none.</summary>
        public Dictionary<int, float> LogitBias { get; set; }
        public UnityEvent<string> OnTextChanged { get { return onTextChanged; } }
        public UnityEvent<string> OnReplyFinished { get { return onReplyFinished; } }

        /// <summary>The reply so far (the whole reply once done).</summary>
        public string CurrentText { get { return text.ToString(); } }
        public bool IsReplying { get { return turn != null; } }

        /// <summary>Each new piece of the reply.</summary>
        public event Action<string> PieceReceived;
        public event Action<GenerationResult> ReplyFinished;
        /// <summary>A turn that failed (not one that was cancelled).</summary>
        public event Action<Exception> ReplyFailed;

        /// <summary>For UI events (a button, an input field's submit): errors go to the log and ReplyFailed.</summary>
        public void Say(string playerLine)
        {
            Forget(SayAsync(playerLine));
        }

        /// <summary>The player says a line; the reply streams into onTextChanged. A line said while the NPC
        /// is still answering cancels that answer first.</summary>
        public Task<GenerationResult> SayAsync(string playerLine, CancellationToken cancellationToken = default(CancellationToken))
        {
            return TurnAsync(async (npc, token) =>
            {
                text.Length = 0;
                onTextChanged.Invoke("");
                try
                {
                    var result = await npc.SayAsync(playerLine, piece =>
                    {
                        text.Append(piece);
                        var handler = PieceReceived;
                        if (handler != null) handler(piece);
                        onTextChanged.Invoke(text.ToString());
                    }, token);
                    var finished = ReplyFinished;
                    if (finished != null) finished(result);
                    onReplyFinished.Invoke(result.Text);
                    return result;
                }
                catch (Exception e) when (!(e is OperationCanceledException))
                {
                    var failed = ReplyFailed;
                    if (failed != null) failed(e);
                    throw;
                }
            }, cancellationToken);
        }

        /// <summary>A structured action: JSON that validates against `jsonSchema`, parsed
        /// (e.g. {"action": "flee"} from an enum). Shares the NPC's session with its dialogue.</summary>
        public Task<NpcAction> ActAsync(string situation, string jsonSchema, CancellationToken cancellationToken = default(CancellationToken))
        {
            return TurnAsync((npc, token) => npc.ActAsync(situation, jsonSchema, token), cancellationToken);
        }

        /// <summary>An action as a function call: the NPC calls one of `tools` (see
        /// NpcConversation.ChooseActionAsync); the result's ToolCall names it, with its arguments.</summary>
        public Task<GenerationResult> ChooseActionAsync(string situation, List<ToolDefinition> tools, ToolChoice choice = null,
            CancellationToken cancellationToken = default(CancellationToken))
        {
            return TurnAsync((npc, token) => npc.ChooseActionAsync(situation, tools, choice, token), cancellationToken);
        }

        /// <summary>How the action went (`result`, JSON or words) goes back to the NPC, which answers in words.</summary>
        public Task<GenerationResult> ToolResultAsync(ToolCall call, string result, CancellationToken cancellationToken = default(CancellationToken))
        {
            return TurnAsync((npc, token) => npc.ToolResultAsync(call, result, null, null, null, token), cancellationToken);
        }

        /// <summary>One turn at a time: a new one cancels the one in progress and waits for it to end.</summary>
        async Task<T> TurnAsync<T>(Func<NpcConversation, CancellationToken, Task<T>> body, CancellationToken cancellationToken)
        {
            var npc = await ConversationAsync();
            Cancel();
            var previous = lastTurn;
            if (previous != null)
            {
                try
                {
                    await previous;
                }
                catch (Exception)
                {
                    // That turn's caller sees its outcome; this one only waits for it to be over.
                }
            }
            using (var mine = CancellationTokenSource.CreateLinkedTokenSource(cancellationToken, lifetime.Token))
            {
                turn = mine;
                var task = body(npc, mine.Token);
                lastTurn = task;
                try
                {
                    return await task;
                }
                finally
                {
                    if (turn == mine)
                        turn = null;
                }
            }
        }

        /// <summary>Stop the reply in progress (the daemon stops generating at once).</summary>
        public void Cancel()
        {
            var current = turn;
            turn = null;
            if (current != null)
                current.Cancel();
        }

        /// <summary>Save games: the NPC's conversation as a string for the game's save (PlayerPrefs, a
        /// JSON save), with its KV cache when `includeKv` (large; resumes without recomputing). Null
        /// when the NPC has said nothing yet.</summary>
        public async Task<string> SaveAsync(bool includeKv = false, CancellationToken cancellationToken = default(CancellationToken))
        {
            var npc = await ConversationAsync();
            return await npc.SaveBase64Async(includeKv, cancellationToken);
        }

        /// <summary>Restore what SaveAsync gave, even after the daemon or the game restarted; the next
        /// line goes on from there. Says whether the KV cache came back ("kv") or the conversation is
        /// computed again at the next line ("text", and why).</summary>
        public async Task<SavedSessionInfo> LoadAsync(string save, CancellationToken cancellationToken = default(CancellationToken))
        {
            var npc = await ConversationAsync();
            Cancel();
            return await npc.LoadAsync(save, cancellationToken);
        }

        /// <summary>The NPC forgets the conversation; the next line starts over with the system prompt.</summary>
        public void ResetConversation()
        {
            if (conversation != null)
                conversation.Reset();
        }

        async Task<NpcConversation> ConversationAsync()
        {
            var client = await SidecarLauncher.Find(launcher).WhenReady;
            if (conversation == null)
                conversation = new NpcConversation(client, NpcId, systemPrompt);
            conversation.SystemPrompt = systemPrompt;
            conversation.MaxTokens = (uint)Math.Max(1, maxTokens);
            conversation.Sampling = new SamplingParams
            {
                Temperature = temperature,
                LogitBias = LogitBias == null ? null : new Dictionary<int, float>(LogitBias),
            };
            return conversation;
        }

        void OnDestroy()
        {
            lifetime.Cancel();
            // Free the NPC's memory on the daemon, best effort: when the whole scene goes, the launcher
            // may have stopped the daemon already.
            if (conversation != null)
                conversation.EndAsync().ContinueWith(t => { var ignored = t.Exception; }, TaskScheduler.Default);
        }

        void Forget(Task task)
        {
            task.ContinueWith(t =>
            {
                var e = t.Exception.GetBaseException();
                if (!(e is OperationCanceledException))
                    Debug.LogException(e, this);
            }, CancellationToken.None, TaskContinuationOptions.OnlyOnFaulted, TaskScheduler.Default);
        }
    }
}
