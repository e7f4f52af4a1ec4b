// A confirmation before every change: a native modal <dialog> (focus trapped, Escape cancels).
import { useEffect, useRef } from "react";

export interface Ask {
  title: string;
  text: string;
  confirm: string;
  onConfirm: () => void;
}

export function ConfirmDialog({ ask, onClose }: { ask: Ask | null; onClose: () => void }) {
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const dialog = ref.current;
    if (!dialog) return;
    if (ask && !dialog.open) dialog.showModal();
    if (!ask && dialog.open) dialog.close();
  }, [ask]);
  return (
    <dialog id="confirm" ref={ref} onClose={onClose} aria-labelledby="confirm-title">
      <h3 id="confirm-title">{ask?.title}</h3>
      <p id="confirm-text">{ask?.text}</p>
      <div className="dialog-buttons">
        <button type="button" onClick={onClose} autoFocus>
          Cancel
        </button>
        <button
          type="button"
          className="solid"
          data-palette="failed"
          onClick={() => {
            const action = ask?.onConfirm;
            onClose();
            action?.();
          }}
        >
          {ask?.confirm ?? "Confirm"}
        </button>
      </div>
    </dialog>
  );
}
