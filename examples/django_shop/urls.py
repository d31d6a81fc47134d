from django.urls import path

from examples.django_shop.orders import views

urlpatterns = [
    path("orders", views.create_order),
    path("orders/<int:order_id>", views.order),
    path("results/<str:result_id>", views.result),
]
