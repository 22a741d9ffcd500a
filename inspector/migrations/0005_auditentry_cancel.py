from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inspector", "0004_change_queue_label"),
    ]

    operations = [
        migrations.AlterField(
            model_name="auditentry",
            name="action",
            field=models.CharField(
                choices=[
                    ("requeue", "Requeue"),
                    ("delete", "Delete"),
                    ("purge", "Purge"),
                    ("pause", "Pause"),
                    ("resume", "Resume"),
                    ("quiet", "Quiet"),
                    ("stop", "Stop"),
                    ("run_now", "Run now"),
                    ("cancel", "Cancel"),
                ],
                max_length=16,
            ),
        ),
    ]
