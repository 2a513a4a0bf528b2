"""Beat task: evaluate every enabled alert rule (GPUMARKET_ALERT_EVALUATE_SECONDS)."""

from celery import shared_task

from alerts import evaluate


@shared_task(name="alerts.tasks.evaluate_alert_rules")
def evaluate_alert_rules() -> list[str]:
    return evaluate.evaluate_all()
