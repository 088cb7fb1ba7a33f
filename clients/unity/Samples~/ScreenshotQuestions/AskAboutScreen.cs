using UnityEngine;
using Xlm.Sidecar.Unity;

namespace Xlm.Sidecar.Samples
{
    /// <summary>
    /// F2 asks the vision model what is on screen; the answer goes to the Console when it is done
    /// (wire ScreenshotQuestion's onTextChanged to a Text to watch it stream). The SidecarLauncher
    /// needs a Projector Path (an mmproj GGUF matching the model).
    /// </summary>
    [RequireComponent(typeof(ScreenshotQuestion))]
    public sealed class AskAboutScreen : MonoBehaviour
    {
        [SerializeField] string question = "What is the player looking at? Answer in one sentence.";

        ScreenshotQuestion vision;

        void Awake()
        {
            vision = GetComponent<ScreenshotQuestion>();
            vision.Answered += result => Debug.Log("Vision: " + result.Text +
                " (" + result.Final.Image.EncodedWidth + "x" + result.Final.Image.EncodedHeight + ", " +
                result.Final.Image.ImageTokens + " image tokens)");
        }

        void Update()
        {
            if (Input.GetKeyDown(KeyCode.F2))
                vision.AskAboutScreen(question);
        }
    }
}
