"""marketplace.urls plus /api/v1/boom/ and /boom/, which raise (a bug on purpose)."""

from django.urls import path

from marketplace import urls as real


def boom(request):
    raise RuntimeError("forced bug for the log test")


urlpatterns = [path("api/v1/boom/", boom), path("boom/", boom), *real.urlpatterns]

handler400 = real.handler400
handler403 = real.handler403
handler404 = real.handler404
handler500 = real.handler500
