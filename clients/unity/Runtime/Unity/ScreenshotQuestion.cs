using System;
using System.Collections;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using UnityEngine;
using UnityEngine.Events;

namespace Xlm.Sidecar.Unity
{
    /// <summary>
    /// Questions about what the player sees: captures the screen at the end of the frame (or reads a
    /// RenderTexture, e.g. a minimap camera's), scales it down on the GPU and asks the vision model.
    /// Needs a daemon started with a projector (SidecarLauncher's projector path); without one the
    /// call fails with FAILED_PRECONDITION.
    /// </summary>
    [AddComponentMenu("XLM Sidecar/Screenshot Question")]
    public sealed class ScreenshotQuestion : MonoBehaviour
    {
        [SerializeField] SidecarLauncher launcher;
        [Tooltip("Longest side of the image sent, in pixels; the daemon may shrink it further for the VRAM budget.")]
        [SerializeField] int maxImageSide = 896;
        [SerializeField] int maxTokens = 128;
        [Tooltip("With a session, follow-up questions about the same image reuse it. Empty: one-off questions.")]
        [SerializeField] string sessionId = "";
        [Tooltip("The answer so far, each time a piece arrives.")]
        [SerializeField] UnityEvent<string> onTextChanged = new UnityEvent<string>();

        readonly CancellationTokenSource lifetime = new CancellationTokenSource();

        public SidecarLauncher Launcher { get { return launcher; } set { launcher = value; } }
        public int MaxImageSide { get { return maxImageSide; } set { maxImageSide = value; } }
        public int MaxTokens { get { return maxTokens; } set { maxTokens = value; } }
        public string SessionId { get { return sessionId; } set { sessionId = value; } }
        public UnityEvent<string> OnTextChanged { get { return onTextChanged; } }

        /// <summary>The whole answer, on the main thread.</summary>
        public event Action<GenerationResult> Answered;

        /// <summary>For UI events: errors go to the log.</summary>
        public void AskAboutScreen(string question)
        {
            AskAboutScreenAsync(question).ContinueWith(t =>
            {
                var e = t.Exception.GetBaseException();
                if (!(e is OperationCanceledException))
                    Debug.LogException(e, this);
            }, CancellationToken.None, TaskContinuationOptions.OnlyOnFaulted, TaskScheduler.Default);
        }

        /// <summary>Capture this frame as the player sees it (UI included) and ask about it.</summary>
        public async Task<GenerationResult> AskAboutScreenAsync(string question, CancellationToken cancellationToken = default(CancellationToken))
        {
            var captured = new TaskCompletionSource<RawImage>();
            StartCoroutine(CaptureAtEndOfFrame(captured));
            return await AskAsync(await captured.Task, question, cancellationToken);
        }

        /// <summary>Ask about a RenderTexture (a camera's target) or another GPU texture.</summary>
        public Task<GenerationResult> AskAboutTextureAsync(Texture texture, string question, CancellationToken cancellationToken = default(CancellationToken))
        {
            return AskAsync(FrameCapture.ReadScaled(texture, maxImageSide), question, cancellationToken);
        }

        IEnumerator CaptureAtEndOfFrame(TaskCompletionSource<RawImage> captured)
        {
            // The back buffer is complete only once the frame has rendered.
            yield return new WaitForEndOfFrame();
            Texture2D shot = null;
            try
            {
                shot = ScreenCapture.CaptureScreenshotAsTexture();
                captured.TrySetResult(FrameCapture.ReadScaled(shot, maxImageSide));
            }
            catch (Exception e)
            {
                captured.TrySetException(e);
            }
            finally
            {
                if (shot != null)
                    Destroy(shot);
            }
        }

        async Task<GenerationResult> AskAsync(RawImage image, string question, CancellationToken cancellationToken)
        {
            var client = await SidecarLauncher.Find(launcher).WhenReady;
            var text = new StringBuilder();
            onTextChanged.Invoke("");
            using (var call = CancellationTokenSource.CreateLinkedTokenSource(cancellationToken, lifetime.Token))
            {
                var result = await client.AskImageAsync(new AskImageRequest
                {
                    Image = ImageInput.FromRaw(image),
                    Question = question,
                    MaxTokens = (uint)Math.Max(1, maxTokens),
                    SessionId = string.IsNullOrEmpty(sessionId) ? null : sessionId,
                }, chunk =>
                {
                    if (chunk.Text.Length == 0)
                        return;
                    text.Append(chunk.Text);
                    onTextChanged.Invoke(text.ToString());
                }, call.Token);
                var answered = Answered;
                if (answered != null) answered(result);
                return result;
            }
        }

        void OnDestroy()
        {
            lifetime.Cancel();
        }
    }
}
